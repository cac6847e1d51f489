"""The one rule that picks the target: ``resolve_target`` (argument, $AIONVRTC_ARCH, the GPU,
a default), and the places that use it."""

from __future__ import annotations

import pytest

from aionvrtc import NoDeviceError, Target, resolve_target

from .support import has_gpu


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Detection fails as on a machine without a GPU (also on one with a GPU)."""
    import cupy

    def no_device(device: object = None) -> None:
        raise cupy.cuda.runtime.CUDARuntimeError(100)

    monkeypatch.setattr(cupy.cuda, "Device", no_device)


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIONVRTC_ARCH", raising=False)


@pytest.mark.usefixtures("no_gpu")
def test_an_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIONVRTC_ARCH", "sm_80")
    assert resolve_target("sm_90") == Target("sm_90")
    assert resolve_target(Target("sm_90a"), default="sm_75") == Target("sm_90a")


@pytest.mark.usefixtures("no_gpu")
def test_the_environment_wins_over_the_gpu_and_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIONVRTC_ARCH", "sm_80")
    assert resolve_target() == Target("sm_80")
    assert resolve_target(None, default="sm_90") == Target("sm_80")
    monkeypatch.setenv("AIONVRTC_ARCH", "")  # set but empty: unset
    assert resolve_target(default="sm_90") == Target("sm_90")


def test_a_bad_environment_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIONVRTC_ARCH", "hopper")
    with pytest.raises(
        ValueError, match=r"^\$AIONVRTC_ARCH: arch must look like 'sm_90'.*'hopper'"
    ):
        resolve_target()


@pytest.mark.usefixtures("no_gpu")
def test_without_a_gpu_the_default_or_an_error_naming_both_ways_out() -> None:
    assert resolve_target(default="sm_90") == Target("sm_90")
    with pytest.raises(NoDeviceError) as info:
        resolve_target()
    assert str(info.value) == (
        "cannot detect the GPU architecture: CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable "
        "device is detected; name the target: arch='sm_90', or $AIONVRTC_ARCH=sm_90"
    )
    assert type(info.value.__cause__).__name__ == "CUDARuntimeError"
    with pytest.raises(ValueError, match="arch must look like"):
        resolve_target(default="hopper")  # a bad default fails without a GPU and with one


def test_with_a_gpu_its_arch_wins_over_the_default() -> None:
    if not has_gpu():
        pytest.skip("needs a GPU")
    assert resolve_target(default="sm_75") == Target.current()

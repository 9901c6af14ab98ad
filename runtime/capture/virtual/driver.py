"""The CUDA driver as a virtual GPU answers it: cuda-python's device queries, and cutlass's
HardwareInfo, from the profile.

cuda-python's functions are replaced on `cuda.bindings.driver` the moment it is imported, so
callers that look them up there (cutlass-dsl, FlashInfer, cuda-python's own helpers) get the
profile's answers, in the bindings' own form: a tuple of a CUresult and the value. A device
attribute the profile does not hold, and every driver call that needs a real GPU (loading a
module, a launch, an allocation, occupancy), raises Unanswerable with its name and call site.
HardwareInfo.get_max_active_clusters, which compiles and loads a probe kernel, answers the
profile's cluster occupancy.
"""

from __future__ import annotations

from cute_aot.runtime.capture.virtual.questions import unanswerable

# Calls a driver with no GPU behind it answers truthfully: initialization, one device, its
# context and synchronization (nothing runs, so there is nothing to wait for).
_SUCCESS_ONLY = (
    "cuInit",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuEventRecord",
    "cuStreamWaitEvent",
    "cuDevicePrimaryCtxRelease",
)


def start(profile) -> None:
    from cute_aot.runtime.capture.import_hook import after_import

    after_import("cuda.bindings.driver", lambda: _answer_driver(profile))
    after_import("cutlass", lambda: _answer_hardware_info(profile))


def _answer_driver(profile) -> None:
    from cuda.bindings import driver

    ok = driver.CUresult.CUDA_SUCCESS

    def attribute(attrib, device=0):
        name = getattr(attrib, "name", str(attrib)).removeprefix("CU_DEVICE_ATTRIBUTE_")
        if name not in profile.attributes:
            raise unanswerable(
                f"cuDeviceGetAttribute({name})", f"profile {profile.name} holds no value for it"
            )
        return ok, profile.attributes[name]

    def total_memory(device=0):
        if profile.total_memory is None:
            raise unanswerable("cuDeviceTotalMem", f"profile {profile.name} holds no memory size")
        return ok, profile.total_memory

    answers = {
        "cuDriverGetVersion": lambda: (ok, profile.driver_version),
        "cuDeviceGetCount": lambda: (ok, 1),
        "cuDeviceGet": lambda ordinal=0: (ok, driver.CUdevice(int(ordinal))),
        "cuDeviceGetAttribute": attribute,
        "cuDeviceGetName": lambda length=256, device=0: (ok, profile.device_name.encode()[:length]),
        "cuDeviceTotalMem": total_memory,
        "cuCtxGetCurrent": lambda: (ok, driver.CUcontext(0)),
        "cuCtxGetDevice": lambda: (ok, driver.CUdevice(0)),
        "cuDevicePrimaryCtxRetain": lambda device=0: (ok, driver.CUcontext(0)),
        "cuGetErrorName": lambda error: (ok, getattr(error, "name", str(error)).encode()),
        "cuGetErrorString": lambda error: (ok, getattr(error, "name", str(error)).encode()),
        **{name: (lambda *args, **kwargs: (ok,)) for name in _SUCCESS_ONLY},
    }
    for name, value in list(vars(driver).items()):
        if name.startswith("cu") and callable(value) and not isinstance(value, type):
            setattr(driver, name, answers.get(name) or _needs_a_gpu(name))


def _needs_a_gpu(name: str):
    def call(*args, **kwargs):
        raise unanswerable(f"CUDA driver call {name}", "it needs a real GPU; no profile covers it")

    call.__name__ = name
    return call


def _answer_hardware_info(profile) -> None:
    from cutlass.utils.hardware_info import HardwareInfo

    def get_max_active_clusters(self, cluster_size: int, stream=None) -> int:
        if cluster_size not in profile.max_active_clusters:
            raise unanswerable(
                f"HardwareInfo.get_max_active_clusters({cluster_size})",
                f"profile {profile.name} holds no cluster occupancy for it",
            )
        return profile.max_active_clusters[cluster_size]

    HardwareInfo.get_max_active_clusters = get_max_active_clusters

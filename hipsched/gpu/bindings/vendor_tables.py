"""The HIP runtime's and the CUDA driver API's C entry points as the ctypes binding (ctypes_api.py) binds
them: each canonical call's argument types once, and the HIP and the CUDA symbol that implements it (the
module API mirrors the driver API argument for argument); the optional ones a driver may lack; and the
enum values of the headers the binding passes (device attributes, flags, status codes)."""
from __future__ import annotations

import ctypes
from ctypes import POINTER as P
from ctypes import c_char_p, c_float, c_int, c_size_t, c_uint, c_void_p

# canonical name -> (argtypes); the symbol tables below name the vendor function for each.
SIGNATURES = {
    "init": [c_uint],
    "driver_version": [P(c_int)],
    "device_count": [P(c_int)],
    "device_name": [c_char_p, c_int, c_int],
    "device_total_mem": [P(c_size_t), c_int],
    "device_attribute": [P(c_int), c_int, c_int],
    "mem_info": [P(c_size_t), P(c_size_t)],
    "malloc": [P(c_void_p), c_size_t],
    "free": [c_void_p],
    "memcpy_htod": [c_void_p, c_void_p, c_size_t, c_void_p],
    "memcpy_dtoh": [c_void_p, c_void_p, c_size_t, c_void_p],
    "memcpy_dtod": [c_void_p, c_void_p, c_size_t, c_void_p],
    "memset_d8": [c_void_p, ctypes.c_ubyte, c_size_t, c_void_p],
    "stream_create": [P(c_void_p), c_uint],
    "stream_destroy": [c_void_p],
    "stream_synchronize": [c_void_p],
    "stream_wait_event": [c_void_p, c_void_p, c_uint],
    "event_create": [P(c_void_p), c_uint],
    "event_destroy": [c_void_p],
    "event_record": [c_void_p, c_void_p],
    "event_synchronize": [c_void_p],
    "event_elapsed": [P(c_float), c_void_p, c_void_p],
    "synchronize": [],
    "module_load": [P(c_void_p), c_char_p],
    "module_unload": [c_void_p],
    "module_function": [P(c_void_p), c_void_p, c_char_p],
    "launch": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, P(c_void_p),
               P(c_void_p)],
}

HIP_SYMBOLS = {
    "init": "hipInit", "driver_version": "hipDriverGetVersion", "device_count": "hipGetDeviceCount",
    "device_name": "hipDeviceGetName", "device_total_mem": "hipDeviceTotalMem",
    "device_attribute": "hipDeviceGetAttribute", "mem_info": "hipMemGetInfo", "malloc": "hipMalloc",
    "free": "hipFree", "memcpy_htod": "hipMemcpyHtoDAsync", "memcpy_dtoh": "hipMemcpyDtoHAsync",
    "memcpy_dtod": "hipMemcpyDtoDAsync", "memset_d8": "hipMemsetD8Async",
    "stream_create": "hipStreamCreateWithFlags", "stream_destroy": "hipStreamDestroy",
    "stream_synchronize": "hipStreamSynchronize", "stream_wait_event": "hipStreamWaitEvent",
    "event_create": "hipEventCreateWithFlags", "event_destroy": "hipEventDestroy",
    "event_record": "hipEventRecord", "event_synchronize": "hipEventSynchronize",
    "event_elapsed": "hipEventElapsedTime", "synchronize": "hipDeviceSynchronize",
    "module_load": "hipModuleLoadData", "module_unload": "hipModuleUnload",
    "module_function": "hipModuleGetFunction", "launch": "hipModuleLaunchKernel",
}

CUDA_SYMBOLS = {
    "init": "cuInit", "driver_version": "cuDriverGetVersion", "device_count": "cuDeviceGetCount",
    "device_name": "cuDeviceGetName", "device_total_mem": "cuDeviceTotalMem_v2",
    "device_attribute": "cuDeviceGetAttribute", "mem_info": "cuMemGetInfo_v2", "malloc": "cuMemAlloc_v2",
    "free": "cuMemFree_v2", "memcpy_htod": "cuMemcpyHtoDAsync_v2", "memcpy_dtoh": "cuMemcpyDtoHAsync_v2",
    "memcpy_dtod": "cuMemcpyDtoDAsync_v2", "memset_d8": "cuMemsetD8Async",
    "stream_create": "cuStreamCreate", "stream_destroy": "cuStreamDestroy_v2",
    "stream_synchronize": "cuStreamSynchronize", "stream_wait_event": "cuStreamWaitEvent",
    "event_create": "cuEventCreate", "event_destroy": "cuEventDestroy_v2",
    "event_record": "cuEventRecord", "event_synchronize": "cuEventSynchronize",
    "event_elapsed": "cuEventElapsedTime", "synchronize": "cuCtxSynchronize",
    "module_load": "cuModuleLoadData", "module_unload": "cuModuleUnload",
    "module_function": "cuModuleGetFunction", "launch": "cuLaunchKernel",
}

# Optional: a driver without them (CUDA before 11.2, old ROCm) gets Runtime's event-based fallbacks.
OPTIONAL_SIGNATURES = {"free_async": [c_void_p, c_void_p], "event_query": [c_void_p],
                       "malloc_async": [P(c_void_p), c_size_t, c_void_p],
                       "default_pool": [P(c_void_p), c_int], "pool_set_attribute": [c_void_p, c_int, c_void_p],
                       "pool_trim": [c_void_p, c_size_t]}
HIP_OPTIONAL = {"free_async": "hipFreeAsync", "event_query": "hipEventQuery", "malloc_async": "hipMallocAsync",
                "default_pool": "hipDeviceGetDefaultMemPool", "pool_set_attribute": "hipMemPoolSetAttribute",
                "pool_trim": "hipMemPoolTrimTo"}
CUDA_OPTIONAL = {"free_async": "cuMemFreeAsync", "event_query": "cuEventQuery", "malloc_async": "cuMemAllocAsync",
                 "default_pool": "cuDeviceGetDefaultMemPool", "pool_set_attribute": "cuMemPoolSetAttribute",
                 "pool_trim": "cuMemPoolTrimTo"}
POOL_FNS = ("malloc_async", "default_pool", "pool_set_attribute", "pool_trim")
POOL_ATTR_RELEASE_THRESHOLD = 4   # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD == hipMemPoolAttrReleaseThreshold
NOT_READY = 600             # hipErrorNotReady == CUDA_ERRORNOT_READY: the event's work is still queued

# Device attributes (hipDeviceAttribute_t from ROCm's hip_runtime_api.h; CUdevice_attribute).
HIP_ATTR = {"multiprocessors": 63, "warp_size": 87, "cc_major": 23, "cc_minor": 61}
CUDA_ATTR = {"multiprocessors": 16, "warp_size": 10, "cc_major": 75, "cc_minor": 76}
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
STREAM_NON_BLOCKING = 1     # hipStreamNonBlocking == CUSTREAM_NON_BLOCKING
EVENT_DEFAULT = 0

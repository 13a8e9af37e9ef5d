/* A fake CUDA driver (libcuda.so) for tests on machines without a GPU: it answers the device
   queries the server makes at start, so placement (KIND_GPU, KIND_AUTO, --gpus, compute
   capability) is tested end to end, and refuses to create contexts, so nothing runs "on" it.

   FAKE_CUDA_DEVICES: the compute capability of each device, e.g. "9.0,8.6" (default "9.0,9.0");
   empty means the driver loads but reports no device (cuInit fails as without a GPU).

   Build: cc -shared -fPIC -o libcuda.so fake_libcuda.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SUCCESS = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101, NOT_SUPPORTED = 801 };

static int majors[16], minors[16], count = -1;

static void load(void) {
    if (count >= 0) return;
    const char *spec = getenv("FAKE_CUDA_DEVICES");
    if (!spec) spec = "9.0,9.0";
    count = 0;
    while (*spec && count < 16) {
        int major = 0, minor = 0, used = 0;
        if (sscanf(spec, "%d.%d%n", &major, &minor, &used) != 2) break;
        majors[count] = major; minors[count] = minor; count++;
        spec += used;
        if (*spec == ',') spec++;
    }
}

int cuInit(unsigned int flags) { (void)flags; load(); return count > 0 ? SUCCESS : NO_DEVICE; }
int cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 13000; return SUCCESS; }
int cuDeviceGetCount(int *n) { load(); if (!n) return INVALID_VALUE; *n = count; return count > 0 ? SUCCESS : NO_DEVICE; }
int cuDeviceGet(int *device, int ordinal) {
    load();
    if (!device) return INVALID_VALUE;
    if (ordinal < 0 || ordinal >= count) return INVALID_DEVICE;
    *device = ordinal; return SUCCESS;
}
int cuDeviceGetName(char *name, int len, int device) {
    if (!name || len <= 0) return INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake GPU %d", device); return SUCCESS;
}
int cuDeviceGetUuid_v2(unsigned char *uuid, int device) {
    if (!uuid) return INVALID_VALUE;
    memset(uuid, 0, 16); uuid[0] = 0xfa; uuid[1] = 0xce; uuid[15] = (unsigned char)device; return SUCCESS;
}
int cuDeviceGetUuid(unsigned char *uuid, int device) { return cuDeviceGetUuid_v2(uuid, device); }
int cuDeviceTotalMem_v2(size_t *bytes, int device) { (void)device; if (!bytes) return INVALID_VALUE; *bytes = (size_t)16 << 30; return SUCCESS; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
    if (!value || device < 0 || device >= count) return INVALID_VALUE;
    switch (attribute) {
    case 75: *value = majors[device]; break;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = minors[device]; break;   /* COMPUTE_CAPABILITY_MINOR */
    case 16: *value = 8; break;                /* MULTIPROCESSOR_COUNT */
    default: *value = 0;
    }
    return SUCCESS;
}
int cuDeviceGetPCIBusId(char *bus, int len, int device) {
    if (!bus || len <= 0) return INVALID_VALUE;
    snprintf(bus, (size_t)len, "0000:%02x:00.0", 0x10 + device); return SUCCESS;
}
int cuDevicePrimaryCtxRetain(void **ctx, int device) { (void)ctx; (void)device; return NOT_SUPPORTED; }
int cuGetErrorString(int e, const char **s) {
    if (!s) return INVALID_VALUE;
    *s = e == NO_DEVICE ? "no CUDA-capable device is detected (fake driver)" : "not supported by the fake driver";
    return SUCCESS;
}
int cuGetErrorName(int e, const char **s) {
    if (!s) return INVALID_VALUE;
    *s = e == NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_NOT_SUPPORTED";
    return SUCCESS;
}

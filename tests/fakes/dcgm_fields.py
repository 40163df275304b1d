"""DCGM's own definitions of the fields sloscope reads, as NVIDIA/DCGM states them, for checking the probe's
mapping against: the id (dcgmlib/dcgm_fields.h), the value type (DCGM_FT_INT64 / DCGM_FT_DOUBLE in
dcgmlib/src/dcgm_fields.cpp) and the unit (the header's comment, the unit string in dcgm_fields.cpp, or what
the cache manager stores):

- FB_TOTAL / FREE / USED / RESERVED: "Frame Buffer in MB" (dcgm-exporter's CSV: MiB).
- GPU_UTIL_RATIO (203): despite its DCGM 4.x name, the int64 `utilization.gpu` of
  nvmlDeviceGetUtilizationRates, a percentage (DcgmCacheManager logs values above 100).
- GPU_TEMP_CELSIUS (150): int64, DCGM_FIELD_UNIT_TEMP_C.
- PROF_SM_UTIL_RATIO (1002), PROF_DRAM_UTIL_RATIO (1005): doubles, ratios ("the ratio of cycles ...").
- PROF_PCIE_{TX,RX}_BYTES (1009, 1010), PROF_NVLINK_{TX,RX}_BYTES (1011, 1012): int64 read from the GPM
  "per second" metrics, so bytes per second.

Each DCGM 4.x name is listed with the older name dcgm_fields.h keeps as its alias (same id).
"""

# name -> (field id, DCGM type, unit)
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": (150, "int64", "Cel"),
    "DCGM_FI_DEV_GPU_TEMP": (150, "int64", "Cel"),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": (203, "int64", "percent"),
    "DCGM_FI_DEV_GPU_UTIL": (203, "int64", "percent"),
    "DCGM_FI_DEV_FB_TOTAL": (250, "int64", "MiB"),
    "DCGM_FI_DEV_FB_FREE": (251, "int64", "MiB"),
    "DCGM_FI_DEV_FB_USED": (252, "int64", "MiB"),
    "DCGM_FI_DEV_FB_RESERVED": (253, "int64", "MiB"),
    "DCGM_FI_DEV_FB_USED_RATIO": (254, "fp64", "ratio"),  # used / (total - reserved): no byte count
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": (1001, "fp64", "ratio"),
    "DCGM_FI_PROF_SM_UTIL_RATIO": (1002, "fp64", "ratio"),
    "DCGM_FI_PROF_SM_ACTIVE": (1002, "fp64", "ratio"),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": (1005, "fp64", "ratio"),
    "DCGM_FI_PROF_DRAM_ACTIVE": (1005, "fp64", "ratio"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (1009, "int64", "B/s"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (1010, "int64", "B/s"),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": (1011, "int64", "B/s"),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": (1012, "int64", "B/s"),
}

# Spellings that look plausible and that DCGM does not define.
NOT_DCGM_FIELDS = ("DCGM_FI_PROF_SM_ACTIVE_RATIO", "DCGM_FI_PROF_DRAM_ACTIVE_RATIO")

"""What a predicted trace calls the device it ran on and the work it drew, per hardware, as PyTorch's profiler records
them on that hardware: the device's properties, the process-group backend, and the kernels its libraries run.

- NVIDIA GPUs (backend `nccl`): cuBLAS's GEMMs by architecture — Volta's `volta_*_s884gemm`, Ampere's
  `ampere_*_s16816gemm` (fp32: `ampere_sgemm`), Hopper's `sm90_xmma_gemm_*`, Blackwell's `nvjet_sm100_*`; attention
  as flash-attention 2 on Ampere (`flash::flash_fwd_kernel`), Transformer Engine's cuDNN fused attention
  on Hopper and Blackwell (`cudnn_generated_fort_native_sdpa_sm90/sm100_flash_fprop`), PyTorch's memory-efficient
  kernel on Volta (flash-attention needs sm80); NCCL's `ncclDevKernel_<Collective>` kernels. Compute capability:
  7.0, 8.0, 9.0, 10.0 (B300: 10.3).
- AMD GPUs (backend `nccl`, as PyTorch names RCCL's on ROCm): hipBLASLt's Tensile kernels (`Cijk_Alik_Bljk_…_ISA942`),
  Composable Kernel's attention (`ck_tile::FmhaFwdKernel`), RCCL's `ncclDevKernel_Generic`. Compute capability as
  ROCm reports the gfx target: gfx90a 9.0, gfx942 9.4, gfx950 9.5; 64-wide wavefronts.
- A CPU (`cpu-…` ids; backend `gloo`): no device, no kernels (`predictor.report.cpu_trace_writer` writes what a CPU
  run's trace holds instead).
- A GPU without a datasheet entry: its id as the device's name, no compute capability, kernels named for what they
  do (`gemm_kernel`, `fmha_fwd_kernel`), claiming no architecture.

The names are those of the corpus's real traces (`../shared/corpus/kineto`: A100 and V100 cuBLAS, H800 sm90_xmma,
B200 nvjet and NCCL 2.27, MI250/MI300X Tensile and RCCL) and of published traces for the cuDNN attention kernels;
`extractors.kineto` classifies predicted and real traces alike by the launching op first, so a kernel's name changes
no reading of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracekit.core.hardware import architecture, hardware_spec

#: GPU architecture → (compute capability, vendor).
CAPABILITY = {"volta": ((7, 0), "nvidia"), "ampere": ((8, 0), "nvidia"), "hopper": ((9, 0), "nvidia"),
              "blackwell": ((10, 0), "nvidia"), "cdna2": ((9, 0), "amd"), "cdna3": ((9, 4), "amd"),
              "cdna4": ((9, 5), "amd")}
#: Dies whose compute capability differs from their architecture's first (Blackwell Ultra: sm_103).
DIE_CAPABILITY = {"GB110": (10, 3)}
#: PyTorch's C++ names of the training dtypes (the template arguments of ATen's kernels).
HALF = {"fp16": "c10::Half", "bf16": "c10::BFloat16", "fp32": "float"}


@dataclass(frozen=True)
class DeviceNames:
    """How one hardware's predicted trace names its device and work (module docstring)."""

    hardware: str
    vendor: str  # nvidia | amd | cpu | unknown (a GPU without a datasheet entry: no architecture claimed)
    arch: str | None
    capability: tuple[int, int] | None
    die: str = ""

    @property
    def cpu(self) -> bool:
        return self.vendor == "cpu"

    @property
    def backend(self) -> str:
        """torch.distributed's backend name (ROCm's RCCL runs as `nccl`, as its traces record it)."""
        return "gloo" if self.cpu else "nccl"

    def device_properties(self) -> list[dict]:
        """`deviceProperties` of the trace: one device as the profiler writes it; none on a CPU."""
        if self.cpu:
            return []
        name = {"amd": f"AMD Instinct {self.hardware}", "nvidia": f"NVIDIA {self.hardware}"}.get(self.vendor,
                                                                                                self.hardware)
        device: dict = {"id": 0, "name": name}
        if self.capability is not None:
            device.update(computeMajor=self.capability[0], computeMinor=self.capability[1])
        spec = hardware_spec(self.hardware)
        if spec is not None:
            device.update(totalGlobalMem=int(spec.memory_gb * 2**30), numSms=spec.sms)
        if self.vendor != "unknown":
            device["warpSize"] = 64 if self.vendor == "amd" else 32
        return [device]

    def gemm_kernel(self, dtype: str) -> str:
        """The GEMM kernel of a `dtype` (a precision recipe's GEMM dtype or a training dtype) matrix multiply."""
        if self.vendor == "amd":
            types = {"bf16": "BBS", "fp16": "HHS", "fp32": "SB"}.get(dtype, "F8B8S")
            isa = self.die[3:] if self.die.startswith("gfx") else "942"
            return (f"Cijk_Alik_Bljk_{types}_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_"
                    f"ASEM1_CLR1_CADS0_EPS0_GRVWA8_GRVWB8_GSUAMB_ISA{isa}_IU1_K1_LBSPPA1024_LPA16_LPB16_WG32_8_1")
        if self.arch == "volta":
            return "volta_sgemm_128x64_tn" if dtype == "fp32" else "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_tn"
        if self.arch == "hopper":
            types = {"bf16": "bf16bf16_bf16f32_f32", "fp16": "f16f16_f16f32_f32", "fp32": "tf32f32_tf32f32_f32"}.get(
                dtype, "e4m3e4m3_e4m3f32_f32")
            return (f"sm90_xmma_gemm_{types}_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
                    "__5x_cublas")
        if self.arch == "blackwell":
            return "nvjet_sm100_tst_256x128_64x5_2x4_2cta_h_bz_TNT"
        if self.vendor == "unknown":
            return f"gemm_kernel_{dtype}"
        if dtype == "fp32":
            return "ampere_sgemm_128x128_tn"
        t = "bf16" if dtype == "bf16" else "fp16"
        return f"ampere_{t}_s16816gemm_{t}_128x128_ldg8_f2f_stages_32x5_tn"

    def attention(self, dtype: str, backward: bool) -> tuple[str, str]:
        """(launching op, kernel) of the fused attention's forward or backward."""
        half = HALF.get(dtype, HALF["bf16"])
        if self.vendor == "amd":
            kernel = ("FmhaBwdDQDKDVKernel<ck_tile::BlockFmhaBwdDQDKDVPipelineKRKTRVR" if backward else
                      "FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync")
            return ("FlashAttnFuncBackward" if backward else "FlashAttnFunc",
                    f"void ck_tile::kentry<2, ck_tile::{kernel}<{half}>>>")
        if self.arch in ("hopper", "blackwell"):
            sm, mma = ("sm90", "wgmma_f16") if self.arch == "hopper" else ("sm100", "f16")
            way, knob = ("bprop", "26_64x64x128") if backward else ("fprop", "7_64x128x128")
            return ("FusedAttnFuncBackward" if backward else "FusedAttnFunc",
                    f"cudnn_generated_fort_native_sdpa_{sm}_flash_{way}_{mma}_knob_{knob}_4x1x1_cga1x1x1_kernel0_0")
        if self.vendor == "unknown":
            return ("FlashAttnFuncBackward" if backward else "FlashAttnFunc",
                    "fmha_bwd_kernel" if backward else "fmha_fwd_kernel")
        if self.arch == "volta":
            kernel = ("fmha_cutlassB_f16_aligned_64x64_k128_sm70" if backward else
                      "fmha_cutlassF_f16_aligned_64x64_rf_sm70")
            return ("aten::_scaled_dot_product_efficient_attention" + ("_backward" if backward else ""), kernel)
        kernel = "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel" if backward else "flash_fwd_kernel"
        return ("FlashAttnFuncBackward" if backward else "FlashAttnFunc",
                f"void flash::{kernel}<Flash_kernel_traits<128, 128, 64, 4, {half}>, true>(Flash_params)")

    def collective_kernel(self, nccl_name: str) -> str:
        """The communication library's kernel of a collective NCCL names `nccl_name` (`AllReduce_Sum_bf16_RING_LL`):
        RCCL runs every collective as its one generic kernel."""
        if self.vendor == "amd":
            return "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
        return f"ncclDevKernel_{nccl_name}(ncclDevComm*, unsigned long, ncclWork*)"


def device_names(hardware: str) -> DeviceNames:
    """The names of a hardware id's predicted traces."""
    if hardware.lower().startswith("cpu-"):
        return DeviceNames(hardware, "cpu", None, None)
    arch = architecture(hardware)
    spec = hardware_spec(hardware)
    if arch is None or spec is None:
        return DeviceNames(hardware, "unknown", None, None)
    capability, vendor = CAPABILITY[arch]
    return DeviceNames(hardware, vendor, arch, DIE_CAPABILITY.get(spec.die, capability), spec.die)

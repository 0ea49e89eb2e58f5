// AMX tiles (Intel Sapphire Rapids and later), shared by the kernels that use them: whether this
// process may use them, and the bf16 split that lets float32 data ride bf16 tile products.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define JUMPGATE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace jumpgate {

// Whether this process may use AMX tiles: built with them and granted by the kernel (Linux asks a
// process to request the tile state once, arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA). Inline
// with a static local: one request per process, whichever kernel asks first.
inline bool amx_usable() {
#if defined(JUMPGATE_AMX)
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
#else
  return false;
#endif
}

}  // namespace jumpgate

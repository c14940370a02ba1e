/* Reductions on float16 and bfloat16 for MPI libraries without half types.
 *
 * mcr moves 16-bit floats as MPI_UINT16_T and reduces them with the user
 * defined operations below, which compute in float32 and round back to the
 * 16-bit format with round-to-nearest-even, as torch does. The conversions are
 * written out in integer arithmetic so that any C99 compiler builds them.
 */
#ifndef MCR_HALFOPS_H
#define MCR_HALFOPS_H

#include <mpi.h>
#include <stdint.h>
#include <string.h>

static inline float mcr_bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t mcr_float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float mcr_half_to_float(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {                       /* zero or subnormal: man * 2^-24 */
    float f = (float)man * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  if (exp == 31)                        /* inf or nan */
    return mcr_bits_to_float(sign | 0x7f800000u | (man << 13));
  return mcr_bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t mcr_float_to_half(float f)
{
  uint32_t u = mcr_float_to_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)                 /* inf, nan (kept quiet) */
    return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u)                 /* rounds past 65504 */
    return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {                /* below 2^-14: subnormal half or zero */
    uint32_t e = a >> 23, q, r, half, shift;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    if (e < 102u) return sign;
    shift = 126u - e;                   /* to units of 2^-24 */
    q = mant >> shift; r = mant & ((1u << shift) - 1u); half = 1u << (shift - 1u);
    if (r > half || (r == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  {
    uint32_t h = ((((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13));
    uint32_t r = a & 0x1fffu;
    if (r > 0x1000u || (r == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
}

static inline float mcr_bf16_to_float(uint16_t b) { return mcr_bits_to_float((uint32_t)b << 16); }

static inline uint16_t mcr_float_to_bf16(float f)
{
  uint32_t u = mcr_float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)  /* nan stays nan */
    return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#define MCR_SUM(a, b) ((a) + (b))
#define MCR_PROD(a, b) ((a) * (b))
#define MCR_MAX(a, b) (((a) != (a) || (a) > (b)) ? (a) : (b))
#define MCR_MIN(a, b) (((a) != (a) || (a) < (b)) ? (a) : (b))

#define MCR_DEFINE_HALF_OP(NAME, OP, LOAD, STORE)                          \
  static void NAME(void *in, void *inout, int *len, MPI_Datatype *dtype)   \
  {                                                                        \
    const uint16_t *x = (const uint16_t *)in;                              \
    uint16_t *y = (uint16_t *)inout;                                       \
    int i, n = *len;                                                       \
    (void)dtype;                                                           \
    for (i = 0; i < n; i++) {                                              \
      float a = LOAD(x[i]), b = LOAD(y[i]);                                \
      y[i] = STORE(OP(a, b));                                              \
    }                                                                      \
  }

MCR_DEFINE_HALF_OP(mcr_f16_sum, MCR_SUM, mcr_half_to_float, mcr_float_to_half)
MCR_DEFINE_HALF_OP(mcr_f16_prod, MCR_PROD, mcr_half_to_float, mcr_float_to_half)
MCR_DEFINE_HALF_OP(mcr_f16_max, MCR_MAX, mcr_half_to_float, mcr_float_to_half)
MCR_DEFINE_HALF_OP(mcr_f16_min, MCR_MIN, mcr_half_to_float, mcr_float_to_half)
MCR_DEFINE_HALF_OP(mcr_bf16_sum, MCR_SUM, mcr_bf16_to_float, mcr_float_to_bf16)
MCR_DEFINE_HALF_OP(mcr_bf16_prod, MCR_PROD, mcr_bf16_to_float, mcr_float_to_bf16)
MCR_DEFINE_HALF_OP(mcr_bf16_max, MCR_MAX, mcr_bf16_to_float, mcr_float_to_bf16)
MCR_DEFINE_HALF_OP(mcr_bf16_min, MCR_MIN, mcr_bf16_to_float, mcr_float_to_bf16)

#endif /* MCR_HALFOPS_H */

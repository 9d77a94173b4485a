// zoo's decoding attention on a CPU (built and called by zoo/nn/cpu_kernels.py): one float32 query a row attending
// over its positions 0..length-1, of a [pages, PAGE, 2K, H] pool through the row's page table (each key head
// followed by its value head, as zoo.engine.pages lays the pool out for a kernel: PagedDecode) or of a dense
// [B, S, K, H] cache of keys and one of values (zoo.infer.sample's: DenseDecode). Each row's keys and values are read
// where they lie, each once, a block of positions at a time: the block's scores from its keys, a running maximum and
// sum, then its values while the block is in cache. Rows are spread over the cores (OpenMP). A page id out of range
// reads page 0 (the engine's scratch page).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// One row: q [N, H] over its first L positions, read a block of up to BLOCK positions at a time: at(start) gives the
// block's first key head and first value head; a position's heads lie `step` floats after the one before, a key
// head `head` floats after the one before. HH: the head dim when known at compile time (0: H_ at run time).
template <int HH, typename At>
static void Row(const float* q, int64_t L, int64_t N, int64_t K, int64_t H_, int64_t BLOCK, At at, int64_t step,
                int64_t head, float scale, float softcap, float* out) {
  const int64_t H = HH ? HH : H_;
  const int64_t G = N / K;  // query heads a key/value head
  std::vector<float> acc(N * H, 0.0f), s(N * BLOCK), top(N, -FLT_MAX), total(N, 0.0f), qs(N * H);
  for (int64_t i = 0; i < N * H; ++i) qs[i] = q[i] * scale;
  for (int64_t start = 0; start < L; start += BLOCK) {
    const auto [keys, values] = at(start);
    const int64_t T = std::min(BLOCK, L - start);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const float* key = keys + t * step + k * head;
        for (int64_t g = 0; g < G; ++g) {
          const float* qn = qs.data() + (k * G + g) * H;
          float d = 0.0f;
#pragma omp simd reduction(+ : d)
          for (int64_t h = 0; h < H; ++h) d += qn[h] * key[h];
          if (softcap > 0.0f) d = softcap * std::tanh(d / softcap);
          s[(k * G + g) * BLOCK + t] = d;
        }
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      float* sn = s.data() + n * BLOCK;
      float m = start == 0 ? sn[0] : top[n];
      for (int64_t t = 0; t < T; ++t) m = std::max(m, sn[t]);
      const float factor = start == 0 ? 0.0f : std::exp(top[n] - m);  // the blocks before, rescaled to m
      top[n] = m;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t t = 0; t < T; ++t) {
        sn[t] = std::exp(sn[t] - m);
        sum += sn[t];
      }
      total[n] = total[n] * factor + sum;
      if (factor != 1.0f) {
        float* a = acc.data() + n * H;
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) a[h] *= factor;
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const float* value = values + t * step + k * head;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t n = k * G + g;
          const float w = s[n * BLOCK + t];
          float* a = acc.data() + n * H;
#pragma omp simd
          for (int64_t h = 0; h < H; ++h) a[h] += w * value[h];
        }
      }
    }
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) out[n * H + h] = acc[n * H + h] / total[n];
}

// Every row b of B, by the head dim's Row: fn(row, b) with row the Row to call.
template <typename F>
static void Rows(int64_t B, int64_t H, F fn) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b) {
    if (H == 64) fn(std::integral_constant<int, 64>(), b);
    else if (H == 128) fn(std::integral_constant<int, 128>(), b);
    else if (H == 32) fn(std::integral_constant<int, 32>(), b);
    else fn(std::integral_constant<int, 0>(), b);
  }
}

// q [B, N, H], pool [P, PAGE, 2K, H], lengths [B] (at least 1 read), table [B, pages] -> out [B, N, H].
static ffi::Error PagedDecode(float scale, float softcap, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> pool,
                              ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::S32> table,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), pd = pool.dimensions(), td = table.dimensions(), ld = lengths.dimensions();
  if (qd.size() != 3 || pd.size() != 4 || td.size() != 2 || ld.size() != 1)
    return ffi::Error::InvalidArgument(
        "zoo paged decode: q [B, N, H], pool [P, PAGE, 2K, H], lengths [B], table [B, pages]");
  const int64_t B = qd[0], N = qd[1], H = qd[2], P = pd[0], PAGE = pd[1], K = pd[2] / 2, NP = td[1];
  if (pd[3] != H || pd[2] != 2 * K || K == 0 || N % K != 0 || td[0] != B || ld[0] != B || P == 0)
    return ffi::Error::InvalidArgument("zoo paged decode: the shapes of q, pool, lengths and table do not agree");
  const float* qp = q.typed_data();
  const float* kv = pool.typed_data();
  const int32_t* len = lengths.typed_data();
  const int32_t* tab = table.typed_data();
  float* op = out->typed_data();
  Rows(B, H, [&](auto hh, int64_t b) {
    const int32_t* pages = tab + b * NP;
    auto at = [&](int64_t start) {
      int64_t page = pages[start / PAGE];
      if (page < 0 || page >= P) page = 0;  // out of range: the engine's scratch page
      const float* pg = kv + page * PAGE * 2 * K * H;
      return std::pair<const float*, const float*>(pg, pg + H);
    };
    const int64_t L = std::min<int64_t>(std::max<int64_t>(len[b], 1), NP * PAGE);
    Row<decltype(hh)::value>(qp + b * N * H, L, N, K, H, PAGE, at, 2 * K * H, 2 * H, scale, softcap, op + b * N * H);
  });
  return ffi::Error::Success();
}

// q [B, N, H], keys and values [B, S, K, H] each (a dense cache), lengths [B] (at least 1 read) -> out [B, N, H].
static ffi::Error DenseDecode(float scale, float softcap, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> keys,
                              ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> lengths,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions(), ld = lengths.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || vd.size() != 4 || ld.size() != 1)
    return ffi::Error::InvalidArgument("zoo dense decode: q [B, N, H], keys and values [B, S, K, H], lengths [B]");
  const int64_t B = qd[0], N = qd[1], H = qd[2], S = kd[1], K = kd[2];
  if (kd[0] != B || kd[3] != H || K == 0 || N % K != 0 || ld[0] != B || S == 0 ||
      !std::equal(kd.begin(), kd.end(), vd.begin()))
    return ffi::Error::InvalidArgument("zoo dense decode: the shapes of q, keys, values and lengths do not agree");
  const float* qp = q.typed_data();
  const float* kp = keys.typed_data();
  const float* vp = values.typed_data();
  const int32_t* len = lengths.typed_data();
  float* op = out->typed_data();
  Rows(B, H, [&](auto hh, int64_t b) {
    auto at = [&](int64_t start) {
      const int64_t at = (b * S + start) * K * H;
      return std::pair<const float*, const float*>(kp + at, vp + at);
    };
    const int64_t L = std::min<int64_t>(std::max<int64_t>(len[b], 1), S);
    Row<decltype(hh)::value>(qp + b * N * H, L, N, K, H, 16, at, K * H, H, scale, softcap, op + b * N * H);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZooPagedDecodeF32, PagedDecode,
                              ffi::Ffi::Bind()
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZooDenseDecodeF32, DenseDecode,
                              ffi::Ffi::Bind()
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

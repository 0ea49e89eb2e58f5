// The AMX path's tile loop (run_tile_amx), included by paged_attention.cpp inside its anonymous
// namespace: it folds a tile's blocks at float32 precision (paged_attention_tiles.h) or bf16
// (paged_attention_bf16.h), so it comes after both.
#pragma once

#include "paged_attention_bf16.h"  // fold_columns, fold_rows: the bf16 precision's block

#if defined(JUMPGATE_AMX)

// SPLIT: the float32 precision (fold_chunk), else bf16 (fold_columns, the output kept [D][state])
template <bool SPLIT>
void run_tile_amx(const Args& a, const Seg* segs, const Tile& t, int64_t kvh) {
  const int64_t G = a.group, D = a.dim;
  segs += t.first_seg;
  int64_t rows = 0, n_max = 0;
  for (int64_t sg = 0; sg < t.num_segs; ++sg) {
    rows += segs[sg].rows;
    n_max = std::max(n_max, segs[sg].n0 + segs[sg].rows - 1);
  }
  States s(rows * G, D);
  if constexpr (!SPLIT) std::fill(s.acc, s.acc + s.stride * D, 0.f);
  for (int64_t sg = 0, st = 0; sg < t.num_segs; ++sg)
    for (int64_t i = 0; i < segs[sg].rows; ++i)
      for (int64_t g = 0; g < G; ++g, ++st)
        s.set_q<SPLIT>(st, a.q + (segs[sg].row0 + i) * a.q_row + (kvh * G + g) * a.q_head, D);
  // The blocks in order, each for all states (a shared block, seg -1) or one segment's; each
  // block's K/V is made into tile operands once for all the states that read it.
  struct Job { int64_t base, seg, st0; };
  thread_local std::vector<Job> jobs;
  jobs.clear();
  for (int64_t b = 0, base = 0; base < n_max; ++b, base += BLK) {
    if (b < t.shared_blocks) { jobs.push_back({base, -1, 0}); continue; }
    for (int64_t sg = 0, st0 = 0; sg < t.num_segs; st0 += segs[sg].rows * G, ++sg)
      if (segs[sg].n0 + segs[sg].rows - 1 > base) jobs.push_back({base, sg, st0});
  }
  BlockKV block(D);
  thread_local std::vector<uint32_t> values_t;
  uint32_t* const vt = SPLIT ? nullptr : scratch(values_t, BLK / 2 * D);
  bool have_vt = false;  // V^T of the current block made (only chunks of many states need it)
  auto fold = [&](int64_t st, int n, const vi& valid) {
    if constexpr (SPLIT) {
      fold_chunk(a, s, block, st, n, valid);
    } else if (n <= ROW_STATES) {
      fold_rows(a, s, block, st, n, valid);
    } else {
      if (!have_vt) transpose_values(block.v, vt, D);
      have_vt = true;
      fold_columns(a, s, block, vt, st, n, valid);
    }
  };
  for (size_t x = 0; x < jobs.size(); ++x) {
    const Job& job = jobs[x];
    const Seg& owner = segs[job.seg < 0 ? 0 : job.seg];  // whose slots address the block
    const int64_t end = job.seg < 0 ? job.base + BLK : owner.n0 + owner.rows - 1;
    const int kc = static_cast<int>(std::min<int64_t>(BLK, end - job.base));
    const float* kp[BLK];
    const float* vp[BLK];
    for (int j = 0; j < kc; ++j) {
      const int64_t off = a.slots[owner.slot_off + job.base + j] * a.slot_stride + kvh * a.head_stride;
      kp[j] = a.k + off;
      vp[j] = a.v + off;
    }
    block.fill<SPLIT>(kp, vp, kc, D);
    have_vt = false;
    if (job.seg < 0) {  // every state of the tile sees all 32 keys
      for (int64_t st = 0; st < s.count; st += TS)
        fold(st, static_cast<int>(std::min<int64_t>(TS, s.count - st)), splat_i(BLK));
      continue;
    }
    const Seg& seg = segs[job.seg];
    const int64_t i0 = std::max<int64_t>(0, job.base - seg.n0 + 1);  // the first row that sees the block
    for (int64_t st = job.st0 + i0 * G; st < job.st0 + seg.rows * G; st += TS) {
      const int n = static_cast<int>(std::min<int64_t>(TS, job.st0 + seg.rows * G - st));
      vi valid = splat_i(BLK);
      for (int k = 0; k < n; ++k) {
        const int64_t i = (st + k - job.st0) / G;
        valid[k] = static_cast<int32_t>(std::min<int64_t>(BLK, seg.n0 + i - job.base));
      }
      fold(st, n, valid);
    }
  }
  for (int64_t sg = 0, st = 0; sg < t.num_segs; ++sg)
    for (int64_t i = 0; i < segs[sg].rows; ++i)
      for (int64_t g = 0; g < G; ++g, ++st) {
        const int64_t dst = ((segs[sg].row0 + i) * a.heads + kvh * G + g) * D;
        for (int64_t c = 0; c < D; c += W) {
          vf o;
          if constexpr (SPLIT) o = load(&s.acc[st * D + c]);
          else  // column st of the [D][stride] output
            o = (vf)_mm512_i32gather_ps(_mm512_mullo_epi32((__m512i)splat_i(static_cast<int32_t>(s.stride)),
                                                           _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)),
                                        &s.acc[c * s.stride + st], 4);
          put(a, dst + c, o / s.l[st], W);
        }
      }
}
#endif  // JUMPGATE_AMX

#include "train/samples.h"

#include <algorithm>

#include "core/byte_tokenizer.h"
#include "core/device.h"
#include "optimized/target.h"

namespace dflash::train {
namespace {

std::vector<int64_t> ids_of(const at::Tensor& t) {  // 1-D int64 -> vector
  const at::Tensor c = t.to(at::kCPU).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Anchors of one row: `n` evenly spaced over the positions a with
// loss_mask[a + 1] (a slot-1 label exists), the first one the position just
// before the first counted token (the prompt's last token).
std::vector<int64_t> row_anchors(const at::Tensor& mask, int64_t n, int64_t bs) {
  const int64_t S = mask.size(0);
  std::vector<int64_t> cand;
  for (int64_t a = 0; a + 1 < S; ++a)
    if (mask[a + 1].item<bool>()) cand.push_back(a);
  std::vector<int64_t> out;
  if (cand.empty()) return out;
  // The last anchor still leaves room for a whole block of labels.
  const int64_t last = std::max<int64_t>(0, int64_t(cand.size()) - bs + 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = cand[size_t(n > 1 ? i * last / (n - 1) : 0)];
    if (out.empty() || a != out.back()) out.push_back(a);
  }
  return out;
}

}  // namespace

nlohmann::json draft_samples(const SampleSource& s, const data::Dataset& eval, int64_t rows,
                             int64_t anchors) {
  const Config& c = *s.c;
  const int64_t bs = c.data.block_size;
  // Byte text, or a target that ships the byte tokenizer: drafts are decoded.
  const bool bytes =
      c.data.byte_text() || (c.target.source == "hf" && has_byte_tokenizer(c.target.path));
  // What the reference column holds: the target's own continuations
  // (self-distillation), or the dataset's tokens.
  const bool by_target = c.data.source == "self_distill";
  nlohmann::json out = {{"tokenizer", bytes ? "byte" : "ids"},
                        {"reference", by_target ? "target" : "dataset"},
                        {"block_size", bs},
                        {"samples", nlohmann::json::array()}};
  at::NoGradGuard ng;
  for (int64_t r = 0; r < std::min<int64_t>(rows, eval.size()); ++r) {
    const at::Tensor mask = eval.loss_mask[r];
    const std::vector<int64_t> a = row_anchors(mask, anchors, bs);
    if (a.empty()) continue;
    const int64_t N = int64_t(a.size());
    StepInputs in{eval.input_ids.narrow(0, r, 1), eval.loss_mask.narrow(0, r, 1), {}, {}, {}};
    if (eval.has_features())
      in.features = eval.features.narrow(0, r, 1),
      in.target_hidden = eval.target_hidden.narrow(0, r, 1);
    in.anchors = {at::tensor(a, at::kLong).unsqueeze(0), at::ones({1, N}, at::kBool)};  // (1, N)
    in = to_device(in, s.device);
    if (!in.features.defined()) {
      const reference::TargetOutputs t = optimized::target_forward(c, *s.target, in.input_ids);
      in.features = t.features, in.target_hidden = t.final_hidden;
    }
    const StepOutputs o = s.fn(c, *s.w, *s.frozen, in);
    const at::Tensor logits = at::matmul(o.student_hidden, s.frozen->lm_head.t());  // (1, Q, V)
    const at::Tensor guess = logits.argmax(-1).squeeze(0).view({N, bs});            // (N, bs)
    const std::vector<int64_t> row = ids_of(eval.input_ids[r]);
    int64_t first = 0;
    while (first < int64_t(row.size()) && !mask[first].item<bool>()) ++first;
    int64_t end = int64_t(row.size());
    while (end > first && !mask[end - 1].item<bool>()) --end;
    nlohmann::json blocks = nlohmann::json::array();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t an = a[size_t(n)], k_end = std::min<int64_t>(bs, end - an);
      std::vector<int64_t> prop, tgt;
      int64_t accepted = 0;
      bool agreeing = true;
      for (int64_t k = 1; k < k_end; ++k) {
        prop.push_back(guess[n][k].item<int64_t>()), tgt.push_back(row[size_t(an + k)]);
        // As tau counts (SPEC step 10): a slot outside the loss mask ends the block.
        agreeing = agreeing && mask[an + k].item<bool>() && prop.back() == tgt.back();
        accepted += agreeing;
      }
      blocks.push_back(
          {{"anchor", an}, {"proposal", prop}, {"target", tgt}, {"accepted", accepted}});
    }
    out["samples"].push_back(
        {{"row", r},
         {"prompt", std::vector<int64_t>(row.begin(), row.begin() + first)},
         {"continuation", std::vector<int64_t>(row.begin() + first, row.begin() + end)},
         {"blocks", blocks}});
  }
  return out;
}

}  // namespace dflash::train

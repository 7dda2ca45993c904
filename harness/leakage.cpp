#include "harness/leakage.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/init.h"
#include "fixtures/fixtures.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

// The first nonzero entry of g (rows, positions, ...) outside `allowed`
// (rows, positions) bool, as {row, position}, or {-1, -1}.
std::pair<int64_t, int64_t> first_outside(const at::Tensor& g, const at::Tensor& allowed) {
  const at::Tensor hit = (g != 0).flatten(2).any(2) & allowed.logical_not();  // (rows, positions)
  if (!hit.any().item<bool>()) return {-1, -1};
  const int64_t flat = hit.flatten().nonzero()[0][0].item<int64_t>();
  return {flat / hit.size(1), flat % hit.size(1)};
}

}  // namespace

HiddenFn reference_hidden() { return reference::drafter_hidden; }

HiddenFn optimized_hidden(const optimized::Components& parts) {
  return [parts](const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                 const StepInputs& in,
                 const DraftLayout& l) { return optimized::drafter_hidden(c, w, f, in, l, parts); };
}

LeakageReport audit_leakage_fixture(const HiddenFn& hidden, const Config& c, int64_t steps) {
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  LeakageReport all;
  for (int64_t s = 0; s < steps; ++s) {
    const LeakageReport r = audit_leakage(hidden, c, w, target.frozen(),
                                          fixtures::make_step_inputs(c, target, uint64_t(s)));
    if (!r.ok()) return r;
    all.blocks += r.blocks, all.sees_context += r.sees_context;
  }
  return all;
}

std::string LeakageReport::format() const {
  if (!ok()) return finding;
  return fmt::format("{} blocks, none reads what it must not ({} read earlier context)", blocks,
                     sees_context);
}

LeakageReport audit_leakage(const HiddenFn& hidden, const Config& c, const DrafterWeights& w,
                            const FrozenWeights& f, const StepInputs& in) {
  Config c64 = c;
  c64.run.dtype = DType::kFloat64;
  // Checkpointing recomputes the same forward (the audit's own checks cover
  // it); its contract declares the embeddings non-differentiable, and the
  // probe's per-slot embeddings are leaves that require grad.
  c64.optimized.checkpoint_layers = false;
  const DrafterWeights w64 = cast(w, at::kDouble);
  const DraftLayout layout =
      make_draft_layout(in.input_ids, in.loss_mask, in.anchors, c.data.block_size,
                        c.data.mask_token_id, c.loss.gamma);
  const int64_t B = in.input_ids.size(0), S = in.input_ids.size(1);
  const int64_t Q = layout.noise_ids.size(1), bs = layout.block_size, N = Q / bs;
  // Leaves: the features, and one embedding row per slot (its own embedding).
  StepInputs probe = in;
  probe.features = in.features.detach().to(at::kDouble).requires_grad_(true);  // (B, S, L*H)
  const at::Tensor table = f.embed_tokens.detach()
                               .to(at::kDouble)
                               .index_select(0, layout.noise_ids.reshape(-1))
                               .requires_grad_(true);  // (B*Q, H)
  DraftLayout slots = layout;
  slots.noise_ids = at::arange(B * Q, layout.noise_ids.options()).view({B, Q});
  const at::Tensor lm = f.lm_head.detach().to(at::kDouble);
  const at::Tensor D = hidden(c64, w64, {table, lm}, probe, slots);  // (B, Q, H)
  const at::Tensor ce = at::cross_entropy_loss(at::matmul(D, lm.t()).flatten(0, 1),
                                               layout.labels.flatten(), {}, at::Reduction::None)
                            .view({B, Q});
  LeakageReport rep;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      const at::Tensor wt = layout.weights[b].narrow(0, n * bs, bs);  // (bs)
      if (!in.anchors.keep[b][n].item<bool>() || !(wt > 0).any().item<bool>()) continue;
      const int64_t a = in.anchors.anchors[b][n].item<int64_t>();
      const at::Tensor loss = (ce[b].narrow(0, n * bs, bs) * wt).sum();
      const auto g = torch::autograd::grad({loss}, {probe.features, table}, {}, true, false, true);
      ++rep.blocks;
      const std::string who = fmt::format("row {} block {} (anchor {})", b, n, a);
      // Features: only its own row, positions before the anchor.
      at::Tensor ok_f = at::zeros({B, S}, at::kBool);
      ok_f[b].narrow(0, 0, a).fill_(true);
      if (g[0].defined()) {
        const auto [r, j] = first_outside(g[0], ok_f);
        if (r >= 0) {
          rep.finding = fmt::format(
              "leak: the loss of {} depends on the target features at row {} position {}{}", who, r,
              j, r == b ? fmt::format(" (>= its anchor {}: not strictly before it)", a) : "");
          return rep;
        }
        rep.sees_context += (g[0][b] != 0).any().item<bool>() ? 1 : 0;
      }
      // Noise embeddings: only its own block's slots.
      at::Tensor ok_x = at::zeros({B, Q}, at::kBool);
      ok_x[b].narrow(0, n * bs, bs).fill_(true);
      if (g[1].defined()) {
        const auto [r, q] = first_outside(g[1].view({B, Q, -1}), ok_x);
        if (r >= 0) {
          rep.finding = fmt::format(
              "leak: the loss of {} depends on the noise embedding of row {} block {} slot {}", who,
              r, q / bs, q % bs);
          return rep;
        }
      }
    }
  }
  return rep;
}

}  // namespace dflash::harness

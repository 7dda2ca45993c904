#include "optimized/step.h"

#include <fmt/format.h>

#include "optimized/checkpoint.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::optimized {
namespace {

// The contract of one checkpointed drafter layer: x and the context must
// receive gradients (x only from layer 1 on: layer 0's x is the frozen
// embedding), and so must every weight of the layer.
CheckpointContract layer_contract(int64_t i, const at::Tensor& x, const at::Tensor& context,
                                  const DecoderLayerWeights& lw) {
  CheckpointContract c;
  c.region = fmt::format("layers.{}", i);
  if (i == 0)
    c.inputs.push_back({"x (frozen embeddings)", x});
  else
    c.grad_inputs.push_back({"x", x});
  c.grad_inputs.push_back({"context", context});
  DecoderLayerWeights view = lw;  // shares the tensors
  visit(view, c.region + ".", [&](const std::string& name, at::Tensor& t) {
    c.params.push_back({name, t});
  });
  return c;
}

DraftLayout real_layout(const Config& c, const StepInputs& in) {
  return make_draft_layout(in.input_ids, in.loss_mask, in.anchors, c.data.block_size,
                           c.data.mask_token_id, c.loss.gamma);
}

at::Tensor real_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const Anchors& a, int64_t S, int64_t bs, int64_t tile, Kernels kernels) {
  return draft_attention(q, k, v, a, S, bs, tile, kernels);
}

}  // namespace

const Components& real_components() {
  static const Components parts{real_layout, real_attention, loss_and_metrics, checkpoint};
  return parts;
}

at::Tensor drafter_hidden(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                          const StepInputs& in, const DraftLayout& layout,
                          const Components& parts) {
  const LayerShape s = c.drafter.shape;
  const OptimizedConfig o = c.optimized;
  const int64_t S = in.input_ids.size(1), bs = layout.block_size;
  at::Tensor x = reference::draft_embeddings(f, layout);                                // (B, Q, H)
  const at::Tensor context = reference::draft_context(w, in.features, s.rms_norm_eps);  // (B, S, H)
  const reference::DraftRope rope = reference::draft_rope(S, layout.positions, s, x.scalar_type());
  // Captured by value: a checkpointed layer re-runs this in backward, after
  // drafter_hidden has returned.
  const Kernels kernels = resolve_kernels(o.kernels, x.device());
  const reference::AttentionFn attend =
      [a = in.anchors, S, bs, o, kernels, sparse = parts.attention](
          const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return o.sparse_attention ? sparse(q, k, v, a, S, bs, o.attention_tile, kernels)
                                  : reference::draft_attention(q, k, v, a, S, bs);
      };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayerWeights& lw = w.layers[i];
    if (!o.checkpoint_layers) {
      x = reference::drafter_layer(x, context, lw, s, rope, attend);
      continue;
    }
    const bool first = i == 0;
    x = parts.checkpoint(layer_contract(int64_t(i), x, context, lw),
                         [first, lw, s, rope, attend](const std::vector<at::Tensor>& g,
                                                      const std::vector<at::Tensor>& in) {
                           const at::Tensor& xi = first ? in[0] : g[0];
                           const at::Tensor& ctx = first ? g[0] : g[1];
                           return reference::drafter_layer(xi, ctx, lw, s, rope, attend);
                         });
  }
  return reference::rms_norm(x, w.norm, s.rms_norm_eps);  // (B, Q, H)
}

StepOutputs drafter_step_with(const Config& c, const DrafterWeights& master, const FrozenWeights& f,
                              const StepInputs& in, const Components& parts) {
  const DrafterWeights w = cast(master, f.lm_head.scalar_type());
  const DraftLayout layout = parts.layout(c, in);
  const at::Tensor D = drafter_hidden(c, w, f, in, layout, parts);
  return c.optimized.chunked_loss
             ? parts.loss(c, D, in.target_hidden, f.lm_head, layout, in.anchors)
             : reference::loss_and_metrics(c, D, in.target_hidden, f.lm_head, layout, in.anchors);
}

StepOutputs drafter_step(const Config& c, const DrafterWeights& master, const FrozenWeights& f,
                         const StepInputs& in) {
  return drafter_step_with(c, master, f, in, real_components());
}

}  // namespace dflash::optimized

// The PyTorch operator library `dflash` (torch.ops.dflash.*): dflash's fused
// LM-head loss and block-sparse draft attention as registered ops, so that a
// PyTorch trainer can use them under torch.compile and activation
// checkpointing. The kernels are optimized/'s own (chunked_lm_loss_forward /
// _backward, draft_attention_forward / _backward): nothing is copied here.
//
// Registered here: the schemas, and one kernel per op for CPU (the host row
// kernels) and CUDA (the ATen rows: resolve_kernels("auto") picks by device).
// The fake (shape-only) kernels and the autograd formulas are registered in
// Python by the package (python/dflash/ops.py, torch.library.register_fake /
// register_autograd): they are the ones torch.compile and opcheck consult.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <torch/version.h>

#include <string>
#include <tuple>

#include "optimized/chunked_loss.h"
#include "optimized/kernels.h"
#include "optimized/sparse_attention.h"

namespace dflash::ops {
namespace {

using optimized::Kernels;

Kernels kernels_for(const at::Tensor& t) { return optimized::resolve_kernels("auto", t.device()); }

void check_float(const at::Tensor& t, const char* op, const char* name) {
  const at::ScalarType s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kDouble || s == at::kBFloat16, "dflash.", op, ": ", name,
              " must be float32, float64 or bfloat16, found ", s);
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* an,
                const char* bn) {
  TORCH_CHECK(a.device() == b.device(), "dflash.", op, ": ", an, " is on ", a.device(), " but ", bn,
              " is on ", b.device());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dflash.", op, ": ", an, " is ", a.scalar_type(),
              " but ", bn, " is ", b.scalar_type());
}

// ---- fused loss -----------------------------------------------------------

void check_loss_inputs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                       const c10::optional<at::Tensor>& teacher,
                       const c10::optional<at::Tensor>& row_weight, const LossConfig& cfg,
                       const std::string& reduction) {
  TORCH_CHECK(input.dim() == 2, "dflash.fused_loss: input must be (N, H), found ", input.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == input.size(1),
              "dflash.fused_loss: weight must be (V, H) with H = ", input.size(1), ", found ",
              weight.sizes());
  check_float(input, "fused_loss", "input");
  check_same(input, weight, "fused_loss", "input", "weight");
  TORCH_CHECK(
      target.dim() == 1 && target.size(0) == input.size(0) && target.scalar_type() == at::kLong,
      "dflash.fused_loss: target must be (N) int64 with N = ", input.size(0), ", found ",
      target.sizes(), " ", target.scalar_type());
  TORCH_CHECK(target.device() == input.device(), "dflash.fused_loss: target is on ",
              target.device(), " but input is on ", input.device());
  // A teacher without a distillation weight is allowed (and unused): a
  // trainer passes it whatever its config's weights.
  TORCH_CHECK(!cfg.uses_teacher() || (teacher.has_value() && teacher->defined()),
              "dflash.fused_loss: a distillation weight (kl, reverse_kl, jsd, tv) is set but "
              "teacher_input is None");
  if (teacher.has_value() && teacher->defined()) {
    TORCH_CHECK(teacher->sizes() == input.sizes(),
                "dflash.fused_loss: teacher_input must have input's shape ", input.sizes(),
                ", found ", teacher->sizes());
    check_same(input, *teacher, "fused_loss", "input", "teacher_input");
  }
  if (row_weight.has_value() && row_weight->defined())
    TORCH_CHECK(row_weight->dim() == 1 && row_weight->size(0) == input.size(0) &&
                    at::isFloatingType(row_weight->scalar_type()) &&
                    row_weight->device() == input.device(),
                "dflash.fused_loss: row_weight must be (N) floating on input's device, found ",
                row_weight->sizes(), " ", row_weight->scalar_type(), " on ", row_weight->device());
  TORCH_CHECK(reduction == "mean" || reduction == "sum",
              "dflash.fused_loss: reduction must be 'mean' or 'sum' (the fused backward needs a "
              "scalar loss), found '",
              reduction, "'");
  TORCH_CHECK(cfg.temperature > 0, "dflash.fused_loss: temperature must be > 0, found ",
              cfg.temperature);
  TORCH_CHECK(cfg.jsd_beta >= 0 && cfg.jsd_beta <= 1,
              "dflash.fused_loss: jsd_beta must lie in [0, 1], found ", cfg.jsd_beta);
}

// Returns (loss (), metrics (7) float64, grad_input (N, H) or (0)). metrics:
// ce, kl, reverse_kl, jsd, tv (each sum(w * term) / sum(w), or / 1 for
// 'sum'), weight_sum, accuracy (argmax == target over the counted rows).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_loss_impl(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
    const c10::optional<at::Tensor>& teacher_input, const c10::optional<at::Tensor>& row_weight,
    int64_t ignore_index, c10::string_view reduction, double ce_weight, double kl_weight,
    double reverse_kl_weight, double jsd_weight, double jsd_beta, double tv_weight,
    double temperature, int64_t chunk_size, bool compute_grad) {
  LossConfig cfg;
  cfg.ce_weight = ce_weight, cfg.kl_weight = kl_weight, cfg.reverse_kl_weight = reverse_kl_weight;
  cfg.jsd_weight = jsd_weight, cfg.jsd_beta = jsd_beta, cfg.tv_weight = tv_weight;
  cfg.temperature = temperature;
  const std::string red(reduction);
  check_loss_inputs(input, weight, target, teacher_input, row_weight, cfg, red);
  const int64_t N = input.size(0), H = input.size(1);
  const at::Tensor x = input.contiguous(), W = weight.contiguous();        // (N, H), (V, H)
  const at::Tensor rows = (target != ignore_index).nonzero().reshape(-1);  // (M) counted rows
  const at::Tensor labels = target.index_select(0, rows);                  // (M)
  if (labels.numel() > 0) {
    const int64_t lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < weight.size(0),
                "dflash.fused_loss: target values must lie in "
                "[0, V = ",
                weight.size(0), ") or equal ignore_index = ", ignore_index, "; found [", lo, ", ",
                hi, "]");
  }
  const auto f64 = input.options().dtype(at::kDouble);
  const at::Tensor w = row_weight.has_value() && row_weight->defined()
                           ? row_weight->to(at::kDouble).index_select(0, rows)
                           : at::ones({rows.numel()}, f64);  // (M)
  const at::Tensor teacher =
      cfg.uses_teacher() ? teacher_input->contiguous() : x.new_empty({0, H});  // (N, H) or (0, H)
  const optimized::FusedLossForward f = optimized::chunked_lm_loss_forward(
      x, teacher, W, rows, rows, labels, w, cfg, chunk_size, kernels_for(x), compute_grad);
  const optimized::ChunkedLossOut& r = f.out;
  const at::ScalarType acc = r.num.scalar_type();
  const at::Tensor wsum = r.weights.sum();  // () float64
  at::Tensor den = at::ones({}, f64);
  if (red == "mean") den = at::where(wsum > 0, wsum, den);  // 0/0 := 0
  const at::Tensor loss = r.num / den.to(acc);              // () fp32 (fp64 for float64 input)
  auto ratio = [&](const at::Tensor& t) { return (r.weights * t).sum() / den; };
  const at::Tensor hits = (r.argmax == labels).to(at::kDouble).sum();
  const at::Tensor accuracy = hits / std::max<int64_t>(rows.numel(), 1);
  const at::Tensor metrics = at::stack({ratio(r.ce), ratio(r.kl), ratio(r.reverse_kl), ratio(r.jsd),
                                        ratio(r.tv), wsum, accuracy});  // (7)
  at::Tensor grad = x.new_empty({0});
  if (compute_grad) {
    TORCH_CHECK(f.grad.defined() && f.grad.size(0) == N, "dflash.fused_loss: no input gradient");
    grad = optimized::chunked_lm_loss_backward(f.grad, {}, (1.0 / den).to(acc));
  }
  return {loss, metrics, grad};
}

at::Tensor fused_loss_backward_impl(const at::Tensor& grad_input, const at::Tensor& grad_loss) {
  TORCH_CHECK(grad_input.dim() == 2,
              "dflash.fused_loss_backward: the forward ran with compute_grad=False (no saved "
              "input gradient); call dflash.fused_loss with an input that requires grad");
  TORCH_CHECK(grad_loss.numel() == 1,
              "dflash.fused_loss_backward: the loss gradient must be a "
              "scalar, found ",
              grad_loss.sizes());
  return optimized::chunked_lm_loss_backward(grad_input, {}, grad_loss.reshape({}));
}

// ---- block-sparse attention ---------------------------------------------

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& anchors, const at::Tensor& keep, int64_t S,
                            int64_t bs) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "dflash.sparse_attention: q (B, nh, Q, hd), k and v (B, nkv, S+Q, hd) expected, "
              "found q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  check_float(q, "sparse_attention", "q");
  check_same(q, k, "sparse_attention", "q", "k");
  check_same(q, v, "sparse_attention", "q", "v");
  TORCH_CHECK(bs >= 1 && S >= 0,
              "dflash.sparse_attention: block_size must be >= 1 and seq_len "
              ">= 0, found ",
              bs, " and ", S);
  TORCH_CHECK(q.size(2) % bs == 0, "dflash.sparse_attention: Q = ", q.size(2),
              " is not a multiple of block_size = ", bs);
  TORCH_CHECK(anchors.dim() == 2 && anchors.scalar_type() == at::kLong &&
                  anchors.size(0) == q.size(0) && anchors.size(1) * bs == q.size(2),
              "dflash.sparse_attention: anchors must be (B, Q / block_size) = (", q.size(0), ", ",
              q.size(2) / bs, ") int64, found ", anchors.sizes(), " ", anchors.scalar_type());
  TORCH_CHECK(keep.sizes() == anchors.sizes() && keep.scalar_type() == at::kBool,
              "dflash.sparse_attention: keep must be (B, N) bool like anchors, found ",
              keep.sizes(), " ", keep.scalar_type());
  TORCH_CHECK(anchors.device() == q.device() && keep.device() == q.device(),
              "dflash.sparse_attention: anchors and keep must be on q's device ", q.device());
  TORCH_CHECK(k.size(2) == S + q.size(2),
              "dflash.sparse_attention: k must have S + Q = ", S + q.size(2), " positions, found ",
              k.size(2));
}

// Returns (out (B, nh, Q, hd), lse (B, nh, Q), out_acc (B, nh, Q, hd) for
// bf16 inputs, else (0)): out_acc and lse are what backward needs.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention_impl(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& anchors,
    const at::Tensor& keep, int64_t seq_len, int64_t block_size, int64_t tile) {
  check_attention_inputs(q, k, v, anchors, keep, seq_len, block_size);
  optimized::DraftAttentionForward f = optimized::draft_attention_forward(
      q, k, v, anchors, keep, seq_len, block_size, tile, kernels_for(q));
  at::Tensor out_acc = f.out_acc.defined() ? f.out_acc : f.lse.new_empty({0});
  return {f.out, f.lse, out_acc};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_attention_backward_impl(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& out_acc,
    const at::Tensor& anchors, const at::Tensor& keep, int64_t seq_len, int64_t block_size,
    int64_t tile) {
  check_attention_inputs(q, k, v, anchors, keep, seq_len, block_size);
  TORCH_CHECK(grad_out.sizes() == q.sizes(),
              "dflash.sparse_attention_backward: grad_out must "
              "have q's shape ",
              q.sizes(), ", found ", grad_out.sizes());
  const at::Tensor saved = out_acc.numel() > 0 ? out_acc : out;
  optimized::DraftAttentionGrads g =
      optimized::draft_attention_backward(grad_out.to(q.scalar_type()), q, k, v, saved, lse,
                                          anchors, keep, seq_len, block_size, tile, kernels_for(q));
  return {g.dq, g.dk, g.dv};
}

std::string build_info() {
  return std::string("{\"dflash\": \"") + DFLASH_VERSION + "\", \"torch\": \"" + TORCH_VERSION +
         "\"}";
}

}  // namespace

TORCH_LIBRARY(dflash, m) {
  m.def(
      "fused_loss(Tensor input, Tensor weight, Tensor target, Tensor? teacher_input, "
      "Tensor? row_weight, int ignore_index, str reduction, float ce_weight, float kl_weight, "
      "float reverse_kl_weight, float jsd_weight, float jsd_beta, float tv_weight, "
      "float temperature, int chunk_size, bool compute_grad) -> (Tensor, Tensor, Tensor)");
  m.def("fused_loss_backward(Tensor grad_input, Tensor grad_loss) -> Tensor");
  m.def(
      "sparse_attention(Tensor q, Tensor k, Tensor v, Tensor anchors, Tensor keep, int seq_len, "
      "int block_size, int tile) -> (Tensor, Tensor, Tensor)");
  m.def(
      "sparse_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor out_acc, Tensor anchors, Tensor keep, int seq_len, int block_size, "
      "int tile) -> (Tensor, Tensor, Tensor)");
  m.def("build_info() -> str", &build_info);
}

TORCH_LIBRARY_IMPL(dflash, CPU, m) {
  m.impl("fused_loss", &fused_loss_impl);
  m.impl("fused_loss_backward", &fused_loss_backward_impl);
  m.impl("sparse_attention", &sparse_attention_impl);
  m.impl("sparse_attention_backward", &sparse_attention_backward_impl);
}

TORCH_LIBRARY_IMPL(dflash, CUDA, m) {
  m.impl("fused_loss", &fused_loss_impl);
  m.impl("fused_loss_backward", &fused_loss_backward_impl);
  m.impl("sparse_attention", &sparse_attention_impl);
  m.impl("sparse_attention_backward", &sparse_attention_backward_impl);
}

}  // namespace dflash::ops

#include "harness/zoo.h"

#include <fmt/format.h>

#include <chrono>

#include "core/alloc_probe.h"
#include "fixtures/fixtures.h"
#include "harness/audit.h"
#include "harness/memory.h"
#include "harness/parity.h"
#include "optimized/chunked_loss.h"
#include "optimized/sparse_attention.h"
#include "optimized/step.h"
#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

using optimized::Components;

StepFn with_parts(Components parts) {
  return [parts](const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                 const StepInputs& in) { return optimized::drafter_step_with(c, w, f, in, parts); };
}

// --- mutants of the attention -------------------------------------------

at::Tensor real_sparse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                       optimized::Kernels kn) {
  return optimized::draft_attention(q, k, v, a, S, bs, tile, kn);
}

// Context visible up to and including the anchor (<= instead of <).
at::Tensor anchor_visible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                          optimized::Kernels kn) {
  const Anchors widened{(a.anchors + 1).clamp_max(S), a.keep};
  return real_sparse(q, k, v, widened, S, bs, tile, kn);
}

// keep = false blocks average every value instead of outputting 0.
at::Tensor keep_false_averages(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                               optimized::Kernels kn) {
  const at::Tensor out = real_sparse(q, k, v, a, S, bs, tile, kn);  // (B, nh, Q, hd)
  const int64_t G = q.size(1) / k.size(1);
  const at::Tensor mean = v.mean(2, true).repeat_interleave(G, 1);  // (B, nh, 1, hd)
  const at::Tensor dropped =
      a.keep.logical_not().repeat_interleave(bs, 1).view({q.size(0), 1, -1, 1});
  return at::where(dropped, mean.expand_as(out), out);
}

// Backward scales by the first element of the upstream gradient.
struct FirstElementGrad : public torch::autograd::Function<FirstElementGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& anchors,
                            const at::Tensor& keep, int64_t S, int64_t bs, int64_t tile,
                            optimized::Kernels kn) {
    ctx->save_for_backward({q, k, v, anchors, keep});
    ctx->saved_data["S"] = S, ctx->saved_data["bs"] = bs, ctx->saved_data["tile"] = tile;
    ctx->saved_data["kernels"] = int64_t(kn);
    return real_sparse(q, k, v, {anchors, keep}, S, bs, tile, kn);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto s = ctx->get_saved_variables();
    at::AutoGradMode on(true);
    std::vector<at::Tensor> in = {s[0].detach().requires_grad_(), s[1].detach().requires_grad_(),
                                  s[2].detach().requires_grad_()};
    const at::Tensor out =
        real_sparse(in[0], in[1], in[2], {s[3], s[4]}, ctx->saved_data["S"].toInt(),
                    ctx->saved_data["bs"].toInt(), ctx->saved_data["tile"].toInt(),
                    optimized::Kernels(ctx->saved_data["kernels"].toInt()));
    const at::Tensor first = g[0].reshape(-1)[0].expand_as(g[0]);  // the mutation
    auto grads = torch::autograd::grad({out}, in, {first});
    return {grads[0], grads[1], grads[2], {}, {}, {}, {}, {}, {}};
  }
};

at::Tensor grad_output_first_element(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const Anchors& a, int64_t S, int64_t bs, int64_t tile,
                                     optimized::Kernels kn) {
  return FirstElementGrad::apply(q, k, v, a.anchors, a.keep, S, bs, tile, kn);
}

at::Tensor dense_fallback(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const Anchors& a, int64_t S, int64_t bs, int64_t, optimized::Kernels) {
  return reference::draft_attention(q, k, v, a, S, bs);
}

// --- mutants of the layout ----------------------------------------------

DraftLayout real_layout(const Config& c, const StepInputs& in) {
  return make_draft_layout(in.input_ids, in.loss_mask, in.anchors, c.data.block_size,
                           c.data.mask_token_id, c.loss.gamma);
}

// Labels shifted by one: slot (n, k) learns input_ids[anchor + k + 1].
DraftLayout shifted_labels(const Config& c, const StepInputs& in) {
  DraftLayout l = real_layout(c, in);
  const int64_t S = in.input_ids.size(1);
  l.labels = in.input_ids.gather(1, (l.positions + 1).clamp_max(S - 1));
  return l;
}

// Decay off by one: exp(-k/gamma) instead of exp(-(k-1)/gamma).
DraftLayout decay_off_by_one(const Config& c, const StepInputs& in) {
  DraftLayout l = real_layout(c, in);
  if (c.loss.gamma > 0) {
    const int64_t bs = c.data.block_size;
    const at::Tensor k = at::arange(l.weights.size(1), at::kDouble).remainder(double(bs));
    l.weights = l.counted.to(at::kDouble) * at::exp(-k / c.loss.gamma);
  }
  return l;
}

// --- mutants of the loss --------------------------------------------------

// The ragged last chunk of weighted positions is dropped (a loop over whole
// chunks only).
StepOutputs dropped_ragged_chunk(const Config& c, const at::Tensor& D, const at::Tensor& Ht,
                                 const at::Tensor& W, const DraftLayout& layout, const Anchors& a) {
  DraftLayout l = layout;
  const at::Tensor rows = (l.weights.reshape(-1) > 0).nonzero().reshape(-1);
  const int64_t M = rows.numel(), C = c.loss.chunk_size > 0 ? c.loss.chunk_size : M;
  const int64_t tail = C > 0 ? M % C : 0;
  if (tail > 0) {
    l.weights = l.weights.clone();
    l.counted = l.counted.clone();
    l.weights.view(-1).index_fill_(0, rows.narrow(0, M - tail, tail), 0.0);
    l.counted.view(-1).index_fill_(0, rows.narrow(0, M - tail, tail), false);
  }
  return optimized::loss_and_metrics(c, D, Ht, W, l, a);
}

// The upstream gradient of the loss ignored (taken as 1): the gradient
// comes out multiplied by the weight sum.
StepOutputs loss_upstream_ignored(const Config& c, const at::Tensor& D, const at::Tensor& Ht,
                                  const at::Tensor& W, const DraftLayout& l, const Anchors& a) {
  StepOutputs o = optimized::loss_and_metrics(c, D, Ht, W, l, a);
  const at::Tensor den = at::where(o.weight_sum > 0, o.weight_sum, at::ones_like(o.weight_sum));
  o.loss = o.loss.detach() + (o.loss - o.loss.detach()) * den;
  return o;
}

// A chunked loss without recomputation: plain autograd per chunk, so every
// chunk's logits stay alive until backward.
StepOutputs chunk_logits_alive(const Config& c, const at::Tensor& D, const at::Tensor& Ht,
                               const at::Tensor& W, const DraftLayout& l, const Anchors& a) {
  const int64_t B = D.size(0), Q = D.size(1), H = D.size(2), S = Ht.size(1);
  const at::Tensor rows = (l.weights.reshape(-1) > 0).nonzero().reshape(-1);
  const int64_t M = rows.numel(),
                C = std::max<int64_t>(1, c.loss.chunk_size > 0 ? c.loss.chunk_size : M);
  const at::Tensor Df = D.reshape({B * Q, H}), Hf = Ht.reshape({B * S, H});
  const at::Tensor trows =
      (at::arange(B, at::kLong).repeat_interleave(Q) * S + l.teacher_index.reshape(-1))
          .index_select(0, rows);
  const at::Tensor labels = l.labels.reshape(-1).index_select(0, rows);
  const at::Tensor w = l.weights.reshape(-1).index_select(0, rows).to(D.scalar_type());
  const LossConfig& L = c.loss;
  at::Tensor num = at::zeros({}, D.scalar_type());
  at::Tensor sums[5] = {num.clone(), num.clone(), num.clone(), num.clone(), num.clone()};
  at::Tensor hit = at::zeros({B * Q}, at::kBool);
  for (int64_t c0 = 0; c0 < M; c0 += C) {
    const int64_t n = std::min(C, M - c0);
    const at::Tensor z =
        reference::project(Df.index_select(0, rows.narrow(0, c0, n)), W);  // (n, V) kept alive
    const at::Tensor lab = labels.narrow(0, c0, n), wc = w.narrow(0, c0, n);
    const at::Tensor ce = at::logsumexp(z, -1) - z.gather(1, lab.unsqueeze(1)).squeeze(1);
    const at::Tensor none = at::zeros_like(ce);  // (n)
    reference::DistillTerms t{none, none, none, none};
    if (L.uses_teacher()) {
      const at::Tensor zt = reference::project(Hf.index_select(0, trows.narrow(0, c0, n)), W);
      t = reference::distill_terms(L, at::log_softmax(z / L.temperature, -1),
                                   at::log_softmax(zt / L.temperature, -1));
    }
    const at::Tensor terms[5] = {ce, t.kl, t.reverse_kl, t.jsd, t.tv};
    const double weights[5] = {L.ce_weight, L.kl_weight, L.reverse_kl_weight, L.jsd_weight,
                               L.tv_weight};
    for (int i = 0; i < 5; ++i) {
      num = num + weights[i] * (wc * terms[i]).sum();
      sums[i] = sums[i] + (wc * terms[i]).sum().detach();
    }
    hit.index_put_({rows.narrow(0, c0, n)}, z.argmax(-1) == lab);
  }
  StepOutputs o;
  o.weight_sum = w.sum().detach();
  const at::Tensor den = at::where(o.weight_sum > 0, o.weight_sum, at::ones_like(o.weight_sum));
  o.loss = num / den;
  o.ce_sum = sums[0], o.kl_sum = sums[1], o.reverse_kl_sum = sums[2], o.jsd_sum = sums[3],
  o.tv_sum = sums[4];
  o.ce = o.ce_sum / den, o.kl = o.kl_sum / den, o.reverse_kl = o.reverse_kl_sum / den,
  o.jsd = o.jsd_sum / den, o.tv = o.tv_sum / den;
  o.set_metrics(slot_metrics(hit.view({B, Q}), l, a));
  o.student_hidden = D.detach();
  return o;
}

// --- mutants of the objectives (docs/LOSSES.md) ----------------------------

enum class ObjectiveBug { kReverseKlNoEntropy, kJsdBetaSwapped, kTvNoJacobian, kDpaceExclusive };

// The per-position distillation terms with one bug, on full logits (plain
// autograd): (B, Q) kl, reverse KL, JSD and TV in the reference's order.
reference::DistillTerms buggy_terms(const LossConfig& L, const at::Tensor& ls, const at::Tensor& lt,
                                    const at::Tensor& z, ObjectiveBug bug) {
  reference::DistillTerms t = reference::distill_terms(L, ls, lt);
  const at::Tensor ps = ls.exp(), pt = lt.exp();
  if (bug == ObjectiveBug::kReverseKlNoEntropy && L.reverse_kl_weight != 0) {
    // The value is right; the gradient of sum p_s log p_s (the entropy) is gone.
    const at::Tensor cross = -(ps * lt).sum(-1);
    t.reverse_kl = cross + ((ps * ls).sum(-1)).detach();
  }
  if (bug == ObjectiveBug::kJsdBetaSwapped && L.jsd_weight != 0 && L.jsd_beta > 0 &&
      L.jsd_beta < 1) {
    const double b = 1 - L.jsd_beta;  // beta on the student's side of the mixture
    const at::Tensor lm = at::logsumexp(at::stack({lt + std::log(b), ls + std::log1p(-b)}), 0);
    t.jsd = L.jsd_beta * (pt * (lt - lm)).sum(-1) + (1 - L.jsd_beta) * (ps * (ls - lm)).sum(-1);
  }
  if (bug == ObjectiveBug::kTvNoJacobian && L.tv_weight != 0) {
    // d TV / d p_s taken as the gradient w.r.t. the logits (no softmax Jacobian).
    const at::Tensor slope = (0.5 / L.temperature) * (ps - pt).sign().detach();
    const at::Tensor lin = (slope * z).sum(-1);
    t.tv = t.tv.detach() + lin - lin.detach();
  }
  return t;
}

// D-PACE's weights from the exclusive prefix product C_{k-1} (the slot's own
// confidence left out).
at::Tensor dpace_exclusive(const at::Tensor& ce, const at::Tensor& counted, int64_t bs,
                           double alpha) {
  const int64_t B = ce.size(0), N = ce.size(1) / bs;
  const at::Tensor c = counted.view({B, N, bs});
  const at::Tensor sm = at::where(
      c, (1 - alpha) * (-ce.detach().to(at::kDouble)).exp().view({B, N, bs}) + alpha, 1.0);
  const at::Tensor incl = sm.cumprod(2);
  const at::Tensor prefix = (incl / sm) * c;  // C_{k-1}
  return (prefix.flip(2).cumsum(2).flip(2) * c).view({B, N * bs});
}

// The whole loss with one objective bug (the reference's formula otherwise).
StepOutputs objective_mutant(const Config& c, const at::Tensor& D, const at::Tensor& Ht,
                             const at::Tensor& W, const DraftLayout& l, const Anchors& a,
                             ObjectiveBug bug) {
  const LossConfig& L = c.loss;
  const int64_t B = D.size(0), Q = D.size(1), H = D.size(2);
  const at::ScalarType acc = D.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor z = reference::project(D, W).to(acc);  // (B, Q, V)
  const at::Tensor ce = at::logsumexp(z, -1) - z.gather(-1, l.labels.unsqueeze(-1)).squeeze(-1);
  const at::Tensor none = at::zeros_like(ce);
  reference::DistillTerms t{none, none, none, none};
  if (L.uses_teacher()) {
    const at::Tensor th = Ht.gather(1, l.teacher_index.unsqueeze(-1).expand({B, Q, H}));
    const at::Tensor lt = at::log_softmax(reference::project(th, W).to(acc) / L.temperature, -1);
    t = buggy_terms(L, at::log_softmax(z / L.temperature, -1), lt, z, bug);
  }
  at::Tensor w = l.weights.to(acc);
  if (L.weighting == Weighting::kDpace) {
    const at::Tensor f = bug == ObjectiveBug::kDpaceExclusive
                             ? dpace_exclusive(ce, l.counted, l.block_size, L.dpace_alpha)
                             : reference::dpace_weights(ce, l.counted, l.block_size, L.dpace_alpha);
    w = (w * f).to(acc);
  }
  StepOutputs o;
  o.weight_sum = w.sum().detach();
  const at::Tensor den = at::where(o.weight_sum > 0, o.weight_sum, at::ones_like(o.weight_sum));
  auto term = [&](const at::Tensor& x, at::Tensor& ratio, at::Tensor& sum) {
    sum = (w * x).sum();
    ratio = (sum / den).detach();
    return sum;
  };
  const at::Tensor ce_s = term(ce, o.ce, o.ce_sum), kl_s = term(t.kl, o.kl, o.kl_sum),
                   rkl_s = term(t.reverse_kl, o.reverse_kl, o.reverse_kl_sum),
                   jsd_s = term(t.jsd, o.jsd, o.jsd_sum), tv_s = term(t.tv, o.tv, o.tv_sum);
  o.loss = (L.ce_weight * ce_s + L.kl_weight * kl_s + L.reverse_kl_weight * rkl_s +
            L.jsd_weight * jsd_s + L.tv_weight * tv_s) /
           den;
  for (at::Tensor* x : {&o.ce_sum, &o.kl_sum, &o.reverse_kl_sum, &o.jsd_sum, &o.tv_sum})
    *x = x->detach();
  o.set_metrics(slot_metrics(z.argmax(-1) == l.labels, l, a));
  o.student_hidden = D.detach();
  return o;
}

LossFn objective_mutant_fn(ObjectiveBug bug) {
  return [bug](const Config& c, const at::Tensor& D, const at::Tensor& Ht, const at::Tensor& W,
               const DraftLayout& l,
               const Anchors& a) { return objective_mutant(c, D, Ht, W, l, a, bug); };
}

// --- mutants of the checkpoint and of the frozen weights -------------------

// A checkpoint without a contract whose differentiable inputs lost their
// graph (what PyTorch's reentrant checkpoint does silently).
at::Tensor detached_checkpoint(const optimized::CheckpointContract& c,
                               const optimized::CheckpointFn& fn) {
  std::vector<at::Tensor> gi, in;
  for (const auto& n : c.grad_inputs) gi.push_back(n.tensor.detach());
  for (const auto& n : c.inputs) in.push_back(n.tensor);
  return fn(gi, in);
}

StepOutputs frozen_embedding_trainable(const Config& c, const DrafterWeights& w,
                                       const FrozenWeights& f, const StepInputs& in) {
  FrozenWeights g = f;
  g.embed_tokens.requires_grad_(true);  // the real frozen tensor now trains
  return optimized::drafter_step(c, w, g, in);
}

// Per-rank normalisation over a two-shard split: each shard divides by its
// own weight sum and the shard losses are averaged.
StepOutputs shard_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                       const StepInputs& in, bool global);

StepOutputs per_rank_normalisation(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                                   const StepInputs& in) {
  return shard_step(c, w, f, in, false);
}

StepInputs rows_of(const StepInputs& in, int64_t begin, int64_t n) {
  return {in.input_ids.narrow(0, begin, n),
          in.loss_mask.narrow(0, begin, n),
          in.features.narrow(0, begin, n),
          in.target_hidden.narrow(0, begin, n),
          {in.anchors.anchors.narrow(0, begin, n), in.anchors.keep.narrow(0, begin, n)}};
}

StepOutputs shard_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                       const StepInputs& in, bool global) {
  const int64_t B = in.input_ids.size(0);
  if (B < 2) return optimized::drafter_step(c, w, f, in);
  const int64_t half = B / 2;
  const StepOutputs a = optimized::drafter_step(c, w, f, rows_of(in, 0, half));
  const StepOutputs b = optimized::drafter_step(c, w, f, rows_of(in, half, B - half));
  StepOutputs o;
  o.weight_sum = a.weight_sum + b.weight_sum;
  const at::Tensor den = at::where(o.weight_sum > 0, o.weight_sum, at::ones_like(o.weight_sum));
  if (global) {  // numerators and denominators summed before dividing
    o.loss = (a.loss * a.weight_sum + b.loss * b.weight_sum) / den;
  } else {  // the mutation: each shard normalised by itself, then averaged
    o.loss = (a.loss + b.loss) / 2;
  }
  o.ce_sum = a.ce_sum + b.ce_sum, o.kl_sum = a.kl_sum + b.kl_sum;
  o.ce = o.ce_sum / den, o.kl = o.kl_sum / den;
  o.reverse_kl_sum = a.reverse_kl_sum + b.reverse_kl_sum, o.reverse_kl = o.reverse_kl_sum / den;
  o.jsd_sum = a.jsd_sum + b.jsd_sum, o.jsd = o.jsd_sum / den;
  o.tv_sum = a.tv_sum + b.tv_sum, o.tv = o.tv_sum / den;
  o.correct = a.correct + b.correct, o.counted = a.counted + b.counted;
  o.accept_sum = a.accept_sum + b.accept_sum, o.kept_blocks = a.kept_blocks + b.kept_blocks;
  o.student_hidden = at::cat({a.student_hidden, b.student_hidden}, 0);
  return o;
}

// --- checks -------------------------------------------------------------------

KillRow parity_kill(const Mutant& m, const StepFn& fn, const PropertyRun& run) {
  const PropertyOutcome o = check_step_parity(fn, run, "parity.step[" + m.name + "]");
  KillRow r{m, !o.passed, o.passed ? "" : "parity", o.size, "", o.seconds};
  if (!o.passed) {
    for (const auto& line : {o.report}) r.detail = line.substr(0, line.find("\nconfig:"));
  }
  return r;
}

Config audit_config() {
  Config c = fixtures::micro_config();
  c.optimized.checkpoint_layers = true;
  return c;
}

KillRow audit_kill(const Mutant& m, const StepFn& fn, char cls) {
  const auto t0 = std::chrono::steady_clock::now();
  const Config c = audit_config();
  const TargetWeights target = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const StepInputs in = fixtures::make_step_inputs(c, target, 0);
  const AuditReport rep = audit_step(fn, c, w, target, in);
  KillRow r{m, rep.has(cls), rep.has(cls) ? "audit" : "", config_size(c), "", 0};
  for (const auto& f : rep.findings) r.detail += f + "; ";
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

template <typename Check>
KillRow memory_kill(const Mutant& m, Check check) {
  const auto t0 = std::chrono::steady_clock::now();
  const MemoryVerdict v = check();
  KillRow r{m,
            !v.ok,
            v.ok ? "" : "memory",
            fmt::format("peak {:.1f} MiB vs ceiling {:.1f} MiB", v.measured / 1048576.0,
                        v.ceiling / 1048576.0),
            v.text,
            0};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

LossFn no_recompute_loss() { return chunk_logits_alive; }

StepOutputs two_shard_step(const Config& c, const DrafterWeights& w, const FrozenWeights& f,
                           const StepInputs& in) {
  return shard_step(c, w, f, in, true);
}

MemoryVerdict attention_memory_check(const AttentionFn& attention, optimized::Kernels kernels) {
  const int64_t S = 1024, N = 16, bs = 16, nh = 8, nkv = 2, hd = 16, T = 64, Q = N * bs;
  const at::Tensor q = at::randn({1, nh, Q, hd}).requires_grad_(),
                   k = at::randn({1, nkv, S + Q, hd}).requires_grad_(),
                   v = at::randn({1, nkv, S + Q, hd}).requires_grad_();
  const Anchors a{std::get<0>(at::randint(1, S - 1, {1, N}, at::kLong).sort(1)),
                  at::ones({1, N}, at::kBool)};
  AllocProbe::install();
  int64_t peak;
  {
    AllocProbe::Scope scope;
    attention(q, k, v, a, S, bs, T, kernels).backward(at::randn({1, nh, Q, hd}));
    peak = scope.peak_delta();
  }
  AttentionSizes z;
  z.nh = nh, z.nkv = nkv, z.Q = Q, z.S = S, z.hd = hd;
  const Formula f = sparse_attention_bytes(z, T, 4, 4, kernels);
  const double ceiling = f.bytes * 1.15 + 256 * 1024;
  return {double(peak) <= ceiling, double(peak), ceiling, f.text};
}

MemoryVerdict loss_memory_check(const LossFn& loss, optimized::Kernels kernels) {
  const int64_t Q = 1024, H = 32, V = 8192, C = 64;
  Config c = fixtures::micro_config();
  c.loss = fixtures::ce_kl_loss(/*kl_weight=*/0.5, C);
  c.optimized.kernels = optimized::kernels_name(kernels);
  const at::Tensor D = at::randn({1, Q, H}).requires_grad_(), Ht = at::randn({1, Q, H}),
                   W = at::randn({V, H});
  const fixtures::CountedRows rows = fixtures::every_row_counted(Q, V);
  const DraftLayout& l = rows.layout;
  const Anchors& a = rows.anchors;
  AllocProbe::install();
  int64_t peak;
  {
    AllocProbe::Scope scope;
    loss(c, D, Ht, W, l, a).loss.backward();
    peak = scope.peak_delta();
  }
  LossSizes z;
  z.M = z.Ns = Q, z.H = H, z.V = V, z.C = C;
  const Formula f = chunked_loss_bytes(z, true, 4, kernels);
  const double ceiling = f.bytes * 1.15 + 256 * 1024;
  return {double(peak) <= ceiling, double(peak), ceiling, f.text};
}

const std::vector<Mutant>& zoo() {
  static const std::vector<Mutant> z = {
      {"detached_checkpoint_input", "a checkpointed region whose differentiable input is detached",
       "audit"},
      {"frozen_embedding_trainable", "frozen weights that receive a gradient or move", "audit"},
      {"shifted_labels", "labels shifted by one", "parity"},
      {"anchor_visible", "context visible up to and including the anchor (<=)", "parity"},
      {"keep_false_averages", "keep = false rows that average values instead of outputting 0",
       "parity"},
      {"dropped_ragged_chunk", "chunk boundaries that drop positions (ragged last chunk)",
       "parity"},
      {"grad_output_first_element", "gradients scaled by grad_output[0]", "parity"},
      {"loss_upstream_ignored", "a loss backward that assumes an upstream gradient of 1", "parity"},
      {"per_rank_normalisation", "loss normalised per rank (two-shard split)", "parity"},
      {"decay_off_by_one", "loss weights decayed from k = 0 instead of k = 1", "parity"},
      {"reverse_kl_without_entropy", "reverse KL whose gradient misses the entropy term", "parity"},
      {"jsd_beta_swapped", "JSD's mixture with beta on the student's side", "parity"},
      {"tv_without_softmax_jacobian", "TV's gradient taken w.r.t. p_s as if it were the logits'",
       "parity"},
      {"dpace_exclusive_prefix", "D-PACE weights from the prefix product without the slot itself",
       "parity"},
      {"dense_scores_fallback", "the optimized attention quietly using dense scores", "memory"},
      {"chunk_logits_alive", "the chunked loss keeping every chunk's logits alive", "memory"},
  };
  return z;
}

Components mutant_components(const std::string& n) {
  Components parts = optimized::real_components();
  if (n == "shifted_labels")
    parts.layout = shifted_labels;
  else if (n == "decay_off_by_one")
    parts.layout = decay_off_by_one;
  else if (n == "anchor_visible")
    parts.attention = anchor_visible;
  else if (n == "keep_false_averages")
    parts.attention = keep_false_averages;
  else if (n == "grad_output_first_element")
    parts.attention = grad_output_first_element;
  else if (n == "dense_scores_fallback")
    parts.attention = dense_fallback;
  else if (n == "dropped_ragged_chunk")
    parts.loss = dropped_ragged_chunk;
  else if (n == "loss_upstream_ignored")
    parts.loss = loss_upstream_ignored;
  else if (n == "chunk_logits_alive")
    parts.loss = chunk_logits_alive;
  else if (n == "reverse_kl_without_entropy")
    parts.loss = objective_mutant_fn(ObjectiveBug::kReverseKlNoEntropy);
  else if (n == "jsd_beta_swapped")
    parts.loss = objective_mutant_fn(ObjectiveBug::kJsdBetaSwapped);
  else if (n == "tv_without_softmax_jacobian")
    parts.loss = objective_mutant_fn(ObjectiveBug::kTvNoJacobian);
  else if (n == "dpace_exclusive_prefix")
    parts.loss = objective_mutant_fn(ObjectiveBug::kDpaceExclusive);
  else if (n == "detached_checkpoint_input")
    parts.checkpoint = detached_checkpoint;
  else if (n != "per_rank_normalisation" && n != "frozen_embedding_trainable")
    throw std::invalid_argument("unknown mutant '" + n + "'");
  return parts;
}

StepFn mutant_step(const std::string& n) {
  if (n == "per_rank_normalisation") return per_rank_normalisation;
  if (n == "frozen_embedding_trainable") return frozen_embedding_trainable;
  return with_parts(mutant_components(n));
}

// The step with its loss and attention on `kernels`, whatever the config says.
StepFn on_kernels(StepFn step, optimized::Kernels kernels) {
  return [step = std::move(step), kernels](const Config& c, const DrafterWeights& w,
                                           const FrozenWeights& f, const StepInputs& in) {
    Config k = c;
    k.optimized.kernels = optimized::kernels_name(kernels);
    return step(k, w, f, in);
  };
}

KillRow run_mutant(const Mutant& m, const PropertyRun& run, optimized::Kernels kernels) {
  const std::string& n = m.name;
  const StepFn step = on_kernels(mutant_step(n), kernels);
  if (n == "detached_checkpoint_input") return audit_kill(m, step, 'a');
  if (n == "frozen_embedding_trainable") return audit_kill(m, step, 'b');
  if (n == "dense_scores_fallback")
    return memory_kill(m, [kernels] { return attention_memory_check(dense_fallback, kernels); });
  if (n == "chunk_logits_alive")
    return memory_kill(m, [kernels] { return loss_memory_check(chunk_logits_alive, kernels); });
  return parity_kill(m, step, run);
}

std::vector<KillRow> run_zoo(const PropertyRun& run, optimized::Kernels kernels) {
  std::vector<KillRow> rows;
  for (const Mutant& m : zoo()) rows.push_back(run_mutant(m, run, kernels));
  return rows;
}

std::string kill_table(const std::vector<KillRow>& rows) {
  std::string s = fmt::format("{:<28} {:<7} {:<9} {:>7}  {}\n", "mutant", "meant", "caught by",
                              "seconds", "counterexample");
  for (const auto& r : rows)
    s += fmt::format("{:<28} {:<7} {:<9} {:>7.2f}  {}\n", r.mutant.name, r.mutant.meant_for,
                     r.killed ? r.caught_by : "SURVIVED", r.seconds, r.size);
  return s;
}

}  // namespace dflash::harness

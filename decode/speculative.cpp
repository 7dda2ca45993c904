// Served speculative decoding over the reference building blocks; see
// speculative.h. Batch of one: every sequence accepts its own lengths.
#include "decode/speculative.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::decode {
namespace {

using namespace dflash::reference;
using models::cat_keys;
using models::iota_rows;
using models::Rope;
using models::rope_at;
using models::TargetCache;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

DFlashDrafter::DFlashDrafter(const Config& c, const DrafterWeights& w, const FrozenWeights& frozen,
                             int64_t block_size)
    : c_(c), f_(frozen), bs_(block_size), k_(w.layers.size()), v_(w.layers.size()) {
  at::NoGradGuard ng;
  w_ = cast(w, frozen.lm_head.scalar_type());
}

void DFlashDrafter::extend(const at::Tensor& taps) {
  at::NoGradGuard ng;
  const LayerShape& s = c_.drafter.shape;
  const int64_t T = taps.size(0), hd = s.head_dim, nkv = s.num_key_value_heads;
  const at::Tensor C = draft_context(w_, taps.unsqueeze(0).to(w_.fc.scalar_type()),
                                     s.rms_norm_eps);  // (1, T, H), SPEC step 4
  const Rope r = rope_at(at::arange(length_, length_ + T, taps.options().dtype(at::kLong)), s,
                         C.scalar_type());  // context keys at their own positions
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w_.layers[l];
    k_[l] = cat_keys(
        k_[l],
        apply_rope(normed_heads(C, lw.k_proj, lw.k_norm, nkv, hd, s.rms_norm_eps), r.cos, r.sin));
    v_[l] = cat_keys(v_[l], split_heads(project(C, lw.v_proj), nkv, hd));
  }
  length_ += T;
}

at::Tensor DFlashDrafter::propose(int64_t anchor_token, int64_t slots) {
  at::NoGradGuard ng;
  const LayerShape& s = c_.drafter.shape;
  const int64_t hd = s.head_dim, nh = s.num_attention_heads, nkv = s.num_key_value_heads;
  const double eps = s.rms_norm_eps;
  const auto opt = f_.embed_tokens.options().dtype(at::kLong);
  // SPEC step 3 with one kept anchor: [anchor, MASK x (bs-1)] at anchor + k.
  at::Tensor noise = at::full({bs_}, c_.data.mask_token_id, opt);
  noise[0] = anchor_token;
  at::Tensor x = f_.embed_tokens.index_select(0, noise).unsqueeze(0);  // (1, bs, H)
  const Rope r = rope_at(at::arange(length_, length_ + bs_, opt), s, x.scalar_type());
  // Step 7: the context is exactly the positions before the anchor, and the
  // block sees itself both ways: every key is visible.
  const at::Tensor mask = at::ones({1, bs_, length_ + bs_}, opt.dtype(at::kBool));
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w_.layers[l];
    const at::Tensor h = rms_norm(x, lw.input_layernorm, eps);  // (1, bs, H)
    const at::Tensor q =
        apply_rope(normed_heads(h, lw.q_proj, lw.q_norm, nh, hd, eps), r.cos, r.sin);
    const at::Tensor k = cat_keys(
        k_[l], apply_rope(normed_heads(h, lw.k_proj, lw.k_norm, nkv, hd, eps), r.cos, r.sin));
    const at::Tensor v = cat_keys(v_[l], split_heads(project(h, lw.v_proj), nkv, hd));
    const at::Tensor x1 = x + project(merge_heads(masked_attention(q, k, v, mask)), lw.o_proj);
    x = x1 + swiglu_mlp(rms_norm(x1, lw.post_attention_layernorm, eps), lw);
  }
  const at::Tensor D = rms_norm(x, w_.norm, eps).narrow(1, 1, slots);  // (1, slots, H), step 8
  const at::ScalarType acc = D.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::log_softmax(project(D, f_.lm_head).to(acc), -1).squeeze(0);  // (slots, V)
}

DraftTree build_tree(const at::Tensor& log_probs, int64_t budget) {
  const int64_t slots = log_probs.size(0), V = log_probs.size(1);
  const int64_t k = std::min<int64_t>(std::max<int64_t>(budget, 1), V);
  const auto [val_t, idx_t] = log_probs.to(at::kCPU, at::kDouble).topk(k, -1);  // (slots, k)
  const auto val = val_t.accessor<double, 2>();
  const auto idx = idx_t.accessor<int64_t, 2>();
  DraftTree t;
  std::map<std::pair<int64_t, int64_t>, int64_t> index;  // (parent, token) -> node
  auto add = [&](int64_t parent, int64_t depth, int64_t token) {
    auto [it, fresh] = index.emplace(std::make_pair(parent, token), t.size());
    if (fresh) t.parent.push_back(parent), t.depth.push_back(depth), t.token.push_back(token);
    return it->second;
  };
  for (int64_t d = 1, parent = -1; d <= slots; ++d) parent = add(parent, d, idx[d - 1][0]);
  // Best-first over prefixes: a popped prefix offers its first child and its
  // next sibling, so prefixes leave the heap in non-increasing probability.
  using Item = std::tuple<double, int64_t, int64_t, int64_t,
                          double>;  // score, -depth, -rank, parent, parent score
  std::priority_queue<Item> heap;
  if (slots > 0) heap.emplace(val[0][0], -1, 0, -1, 0.0);
  for (int64_t pops = 0; pops < budget && !heap.empty(); ++pops) {
    const auto [score, nd, nr, parent, base] = heap.top();
    heap.pop();
    const int64_t d = -nd, rank = -nr;
    const int64_t node = add(parent, d, idx[d - 1][rank]);
    if (d < slots) heap.emplace(score + val[d][0], -(d + 1), 0, node, score);
    if (rank + 1 < k) heap.emplace(base + val[d - 1][rank + 1], -d, -(rank + 1), parent, base);
  }
  return t;
}

void check_decode_inputs(const Config& c, const std::vector<int64_t>& prompt,
                         const DecodeOptions& o, const std::string& what) {
  const int64_t V = c.target.vocab_size;
  if (prompt.empty()) throw std::runtime_error(what + ": the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      throw std::runtime_error(
          fmt::format("{}: token {} of the prompt is {}, outside the vocabulary [0, {})", what, i,
                      prompt[i], V));
  if (int64_t(prompt.size()) > o.max_context)
    throw std::runtime_error(fmt::format(
        "{}: the prompt has {} tokens, more than the context limit {} (max_context); prompts "
        "are never truncated",
        what, prompt.size(), o.max_context));
  if (o.block_size < 2)
    throw std::runtime_error(fmt::format("{}: block_size {} < 2", what, o.block_size));
  if (o.tree_budget < 0 || o.max_new_tokens < 0)
    throw std::runtime_error(what + ": tree_budget and max_new_tokens must be >= 0");
}

namespace {

// What every decoding starts with: the inputs checked (`what` names the
// decoding in messages), the clock, the result, the target's cache and the
// tokens still allowed after the prompt.
struct Decoding {
  Decoding(const Config& c, const TargetWeights& target, const std::vector<int64_t>& prompt,
           const DecodeOptions& o, const std::string& what)
      : tc(c, target, o.banned_token) {
    check_decode_inputs(c, prompt, o, what);
    allowed = std::min<int64_t>(o.max_new_tokens, o.max_context - int64_t(prompt.size()));
  }
  double t0 = now();
  DecodeResult res;
  TargetCache tc;
  int64_t allowed = 0;
};

// One sequence through the target's cache (batch of one): the greedy
// choices on the host (C) and the taps (T, L*H).
struct Verified {
  at::Tensor choice, taps;
};
Verified verify(TargetCache& tc, const std::vector<int64_t>& toks, const std::vector<int64_t>& pos,
                const at::Tensor& visible, int64_t choices_from = 0) {
  const TargetCache::Out out = tc.forward(at::tensor(toks, at::kLong).unsqueeze(0),
                                          at::tensor(pos, at::kLong), visible, choices_from);
  return {out.choice[0].cpu(), out.taps.defined() ? out.taps[0] : at::Tensor()};
}

// The prompt through the target: its taps and the first generated token.
Verified prefill(TargetCache& tc, const std::vector<int64_t>& prompt, DecodeResult& res) {
  const double t0 = now();
  const int64_t P = int64_t(prompt.size());
  Verified out = verify(tc, prompt, iota_rows(P), {}, P - 1);
  tc.commit(iota_rows(P));
  res.target_forwards = 1;
  res.target_s += now() - t0;
  return out;
}

// Ancestor-only visibility of [root; tree nodes] (1 + n, 1 + n): a node sees
// the root, its ancestors and itself.
at::Tensor ancestor_mask(const DraftTree& t) {
  const int64_t n = t.size();
  at::Tensor m = at::zeros({n + 1, n + 1}, at::kBool);
  auto a = m.accessor<bool, 2>();
  a[0][0] = true;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i; j >= 0; j = t.parent[size_t(j)]) a[i + 1][j + 1] = true, a[i + 1][0] = true;
  return m;
}

// The walk down the tree: from the root, while some child carries the
// target's greedy choice after its parent, step into it (a stop token ends
// the walk once accepted). Returns the accepted nodes, root excluded.
std::vector<int64_t> accept_path(const DraftTree& t, const at::Tensor& choice, int64_t stop) {
  const auto g = choice.accessor<int64_t, 1>();  // (1 + n)
  std::vector<int64_t> path;
  for (int64_t cur = -1;;) {
    const int64_t want = g[cur + 1];
    int64_t next = -1;
    for (int64_t i = 0; i < t.size() && next < 0; ++i)
      if (t.parent[size_t(i)] == cur && t.token[size_t(i)] == want) next = i;
    if (next < 0) return path;
    path.push_back(next);
    if (want == stop) return path;
    cur = next;
  }
}

}  // namespace

DecodeResult greedy_decode(const Config& c, const TargetWeights& target,
                           const std::vector<int64_t>& prompt, const DecodeOptions& o) {
  Decoding d(c, target, prompt, o, "greedy decoding");
  DecodeResult& res = d.res;
  if (d.allowed <= 0) return res;
  int64_t next = prefill(d.tc, prompt, res).choice[-1].item<int64_t>();
  for (;;) {
    res.tokens.push_back(next);
    if (int64_t(res.tokens.size()) >= d.allowed || next == o.stop_token) break;
    const double t1 = now();
    const int64_t pos = d.tc.length();
    next = verify(d.tc, {next}, {pos}, {}).choice[0].item<int64_t>();
    d.tc.commit({0});
    ++res.target_forwards;
    res.target_s += now() - t1;
  }
  res.total_s = now() - d.t0;
  return res;
}

DecodeResult speculative_decode(const Config& c, const TargetWeights& target, Drafter& drafter,
                                const std::vector<int64_t>& prompt, const DecodeOptions& o) {
  Decoding d(c, target, prompt, o, "speculative decoding");
  DecodeResult& res = d.res;
  if (d.allowed <= 0) return res;
  Verified out = prefill(d.tc, prompt, res);
  double t1 = now();
  drafter.extend(out.taps);
  res.drafter_s += now() - t1;
  int64_t next = out.choice[-1].item<int64_t>();  // the first bonus token: the anchor
  res.tokens.push_back(next);
  while (int64_t(res.tokens.size()) < d.allowed && next != o.stop_token) {
    const int64_t p = d.tc.length();  // the anchor's position: context is [0, p)
    TORCH_CHECK(drafter.context_length() == p, "speculative decoding: the drafter's context has ",
                drafter.context_length(), " positions, the anchor is at ", p,
                " (SPEC step 7: exactly the positions before the anchor)");
    // The bonus token needs one place, the proposal the rest.
    const int64_t slots =
        std::min<int64_t>(o.block_size - 1, d.allowed - int64_t(res.tokens.size()) - 1);
    t1 = now();
    DraftTree tree;  // budget 0: the greedy chain (block decoding)
    if (slots > 0) tree = build_tree(drafter.propose(next, slots), o.tree_budget);
    res.drafter_s += now() - t1;
    t1 = now();
    std::vector<int64_t> toks = {next}, pos = {p};
    for (int64_t i = 0; i < tree.size(); ++i)
      toks.push_back(tree.token[size_t(i)]), pos.push_back(p + tree.depth[size_t(i)]);
    out = verify(d.tc, toks, pos,
                 o.tree_budget > 0 ? ancestor_mask(tree) : at::Tensor());  // block: causal
    const std::vector<int64_t> path = accept_path(tree, out.choice, o.stop_token);
    std::vector<int64_t> rows = {0};
    for (int64_t n : path) rows.push_back(n + 1), res.tokens.push_back(tree.token[size_t(n)]);
    d.tc.commit(rows);
    ++res.target_forwards;
    res.target_s += now() - t1;
    res.accepted.push_back(int64_t(path.size()));
    res.slots.push_back(slots);
    res.nodes.push_back(tree.size());
    if (!path.empty() && tree.token[size_t(path.back())] == o.stop_token) {
      res.stopped = true;
      break;
    }
    next = out.choice[rows.back()].item<int64_t>();  // the target's own next token
    res.tokens.push_back(next);
    t1 = now();
    drafter.extend(out.taps.index_select(0, at::tensor(rows, at::kLong).to(out.taps.device())));
    res.drafter_s += now() - t1;
  }
  res.total_s = now() - d.t0;
  return res;
}

}  // namespace dflash::decode

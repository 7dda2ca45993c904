// Served speculative decoding: the cached target equals the plain forward,
// the served drafter equals the SPEC step at one anchor, block and tree
// decoding commit exactly the target's greedy text (generated cases), budget
// 1 is block decoding, the tree is the best-first set, bad prompts are refused.
#include "decode/speculative.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <set>

#include "decode/speculative_test_support.h"
#include "fixtures/fixtures.h"
#include "harness/generators.h"
#include "reference/layers.h"
#include "reference/step.h"
#include "reference/target.h"

namespace dflash::decode {
namespace {

using testing::DecodeCase;
using testing::OracleDrafter;

// SPEC's plain greedy: the whole prefix through reference::target_forward per token.
std::vector<int64_t> naive_greedy(const Config& c, const TargetWeights& t, std::vector<int64_t> ids,
                                  int64_t n, int64_t banned) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto o = reference::target_forward(c, t, at::tensor(ids, at::kLong).unsqueeze(0));
    at::Tensor logits = reference::target_logits(t, o.final_hidden)[0][-1].clone();  // (V)
    if (banned >= 0) logits[banned] = -INFINITY;
    out.push_back(logits.argmax().item<int64_t>());
    ids.push_back(out.back());
  }
  return out;
}

RC_GTEST_PROP(Speculative, GreedyDecodeEqualsUncachedForward, ()) {
  const DecodeCase k = *testing::gen_decode_case();
  const TargetWeights t = make_target(k.c);
  const DecodeResult g = greedy_decode(k.c, t, k.prompt, k.o);
  RC_ASSERT(g.tokens == naive_greedy(k.c, t, k.prompt, int64_t(g.tokens.size()), k.o.banned_token));
  const int64_t room =
      std::min<int64_t>(k.o.max_new_tokens, k.o.max_context - int64_t(k.prompt.size()));
  const bool stopped = !g.tokens.empty() && g.tokens.back() == k.o.stop_token;
  RC_ASSERT(int64_t(g.tokens.size()) == room || stopped);
}

// SPEC steps 3-8 at one kept anchor p: the served drafter (context fed in
// pieces, keys cached) against reference::drafter_hidden on the whole row.
RC_GTEST_PROP(Speculative, ServedDrafterEqualsTheSpecStep, ()) {
  const Config c = *harness::gen_micro_config();
  const int64_t bs = c.data.block_size, p = *rc::gen::inRange<int64_t>(1, 12);
  const TargetWeights t = make_target(c);
  const DrafterWeights w = make_drafter(c);
  const at::Tensor ids =
      at::tensor(*rc::gen::container<std::vector<int64_t>>(
                     size_t(p + bs), rc::gen::inRange<int64_t>(0, c.target.vocab_size)),
                 at::kLong)
          .unsqueeze(0);  // (1, S)
  const auto tf = reference::target_forward(c, t, ids);
  StepInputs in{ids,
                at::ones({1, p + bs}, at::kBool),
                tf.features,
                tf.final_hidden,
                {at::full({1, 1}, p, at::kLong), at::ones({1, 1}, at::kBool)}};
  const DraftLayout layout = make_draft_layout(in.input_ids, in.loss_mask, in.anchors, bs,
                                               c.data.mask_token_id, c.loss.gamma);
  const at::Tensor D = reference::drafter_hidden(c, cast(w, at::kDouble), t.frozen(), in, layout);
  const at::Tensor want =
      at::log_softmax(reference::project(D[0].narrow(0, 1, bs - 1), t.lm_head), -1);
  DFlashDrafter d(c, w, t.frozen(), bs);
  for (int64_t at_ = 0; at_ < p;) {  // context in pieces of 1..3 rows
    const int64_t n = std::min<int64_t>(p - at_, *rc::gen::inRange<int64_t>(1, 4));
    d.extend(tf.features[0].narrow(0, at_, n));
    at_ += n;
  }
  const at::Tensor got = d.propose(ids[0][p].item<int64_t>(), bs - 1);  // (bs-1, V)
  RC_LOG() << "max abs " << (got - want).abs().max().item<double>();
  RC_ASSERT(at::allclose(got, want, 1e-10, 1e-10));  // float64: only summation order differs
}

RC_GTEST_PROP(Speculative, BlockDecodingIsLossless, ()) {
  const DecodeCase k = *testing::gen_decode_case();
  const TargetWeights t = make_target(k.c);
  const DrafterWeights w = make_drafter(k.c);
  const DecodeResult g = greedy_decode(k.c, t, k.prompt, k.o);
  DFlashDrafter d(k.c, w, t.frozen(), k.o.block_size);
  const DecodeResult s = speculative_decode(k.c, t, d, k.prompt, k.o);
  RC_ASSERT(s.tokens == g.tokens);
  // An oracle that drafts the greedy text with errors reaches every accept length.
  OracleDrafter oracle(g.tokens, int64_t(k.prompt.size()), k.c.target.vocab_size, k.seed, 0.0,
                       k.o.stop_token);
  const DecodeResult so = speculative_decode(k.c, t, oracle, k.prompt, k.o);
  RC_ASSERT(so.tokens == g.tokens);
  RC_ASSERT(testing::drafted_accepts(so) == oracle.expected_accepts());
}

RC_GTEST_PROP(Speculative, TreeDecodingIsLossless, ()) {
  DecodeCase k = *testing::gen_decode_case();
  k.o.tree_budget = *rc::gen::element<int64_t>(1, 2, 3, 4, 16, 64);
  const TargetWeights t = make_target(k.c);
  const DrafterWeights w = make_drafter(k.c);
  const DecodeResult g = greedy_decode(k.c, t, k.prompt, k.o);
  DFlashDrafter d(k.c, w, t.frozen(), k.o.block_size);
  RC_ASSERT(speculative_decode(k.c, t, d, k.prompt, k.o).tokens == g.tokens);
  // The oracle ranks the true token second where its first guess is wrong:
  // a tree recovers what the chain loses, never less.
  OracleDrafter oracle(g.tokens, int64_t(k.prompt.size()), k.c.target.vocab_size, k.seed, 1.0,
                       k.o.stop_token);
  const DecodeResult so = speculative_decode(k.c, t, oracle, k.prompt, k.o);
  RC_ASSERT(so.tokens == g.tokens);
  const std::vector<int64_t> got = testing::drafted_accepts(so);
  RC_ASSERT(got.size() == oracle.expected_accepts().size());
  // The sibling holding the true token is among the best slots + 1
  // prefixes (slots <= 7): budgets >= 8 recover one more token there.
  for (size_t r = 0; r < got.size(); ++r)
    RC_ASSERT(got[r] >= oracle.expected_accepts()[r] +
                            (k.o.tree_budget >= 8 && oracle.recoverable()[r] ? 1 : 0));
}

RC_GTEST_PROP(Speculative, BudgetOneIsBlockDecoding, ()) {
  DecodeCase k = *testing::gen_decode_case();
  const TargetWeights t = make_target(k.c);
  const DrafterWeights w = make_drafter(k.c);
  DFlashDrafter d0(k.c, w, t.frozen(), k.o.block_size);
  const DecodeResult block = speculative_decode(k.c, t, d0, k.prompt, k.o);
  k.o.tree_budget = 1;
  DFlashDrafter d1(k.c, w, t.frozen(), k.o.block_size);
  const DecodeResult tree = speculative_decode(k.c, t, d1, k.prompt, k.o);
  RC_ASSERT(tree.tokens == block.tokens);
  RC_ASSERT(tree.accepted == block.accepted);
  RC_ASSERT(tree.nodes == block.nodes);
}

// build_tree against brute force: every prefix of the slots scored by the
// product of its probabilities, the `budget` best kept, the chain added.
RC_GTEST_PROP(Speculative, TreeIsChainPlusBestPrefixes, ()) {
  const int64_t slots = *rc::gen::inRange<int64_t>(1, 4), V = *rc::gen::inRange<int64_t>(2, 5);
  const int64_t budget = *rc::gen::inRange<int64_t>(0, 30);
  const std::vector<int64_t> raw = *rc::gen::container<std::vector<int64_t>>(
      size_t(slots * V), rc::gen::inRange<int64_t>(0, 1000000));
  // Square roots of distinct integers: no two different paths tie exactly.
  const at::Tensor tie_break = at::arange(2, 2 + slots * V, at::kDouble).sqrt().view({slots, V});
  const at::Tensor lp = at::log_softmax(
      at::tensor(raw, at::kLong).to(at::kDouble).view({slots, V}) * 1e-5 + 1e-3 * tie_break,
      -1);  // (slots, V)
  const DraftTree tree = build_tree(lp, budget);
  auto path_of = [&](int64_t i) {
    std::vector<int64_t> p;
    for (; i >= 0; i = tree.parent[size_t(i)]) p.insert(p.begin(), tree.token[size_t(i)]);
    return p;
  };
  std::set<std::vector<int64_t>> got;
  for (int64_t i = 0; i < tree.size(); ++i) {
    RC_ASSERT(tree.parent[size_t(i)] < i);
    RC_ASSERT(got.insert(path_of(i)).second);  // no duplicate node
  }
  std::vector<std::pair<double, std::vector<int64_t>>> all;
  std::vector<std::vector<int64_t>> frontier = {{}};
  for (int64_t d = 0; d < slots; ++d) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& f : frontier)
      for (int64_t v = 0; v < V; ++v) next.push_back(f), next.back().push_back(v);
    for (const auto& p : next) {
      double s = 0;
      for (size_t j = 0; j < p.size(); ++j) s += lp[int64_t(j)][p[j]].item<double>();
      all.emplace_back(s, p);
    }
    frontier = next;
  }
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::set<std::vector<int64_t>> want;
  for (int64_t i = 0; i < std::min<int64_t>(budget, int64_t(all.size())); ++i)
    want.insert(all[size_t(i)].second);
  std::vector<int64_t> chain;
  for (int64_t d = 0; d < slots; ++d)
    chain.push_back(lp[d].argmax().item<int64_t>()), want.insert(chain);
  RC_ASSERT(got == want);
}

// The states handed to the drafter are the target's tapped layers at the
// committed positions, in order (tree rounds included): the reference
// forward over the whole decoded text gives the same rows.
RC_GTEST_PROP(Speculative, DrafterContextIsTheTargetsTappedStatesOfCommittedPositions, ()) {
  DecodeCase k = *testing::gen_decode_case();
  k.o.tree_budget = *rc::gen::element<int64_t>(0, 16);
  const TargetWeights t = make_target(k.c);
  const DecodeResult g = greedy_decode(k.c, t, k.prompt, k.o);
  OracleDrafter oracle(g.tokens, int64_t(k.prompt.size()), k.c.target.vocab_size, k.seed, 1.0,
                       k.o.stop_token);
  testing::RecordingDrafter rec(oracle);
  const DecodeResult s = speculative_decode(k.c, t, rec, k.prompt, k.o);
  RC_ASSERT(s.tokens == g.tokens);
  if (s.tokens.empty()) return;
  std::vector<int64_t> text = k.prompt;
  text.insert(text.end(), s.tokens.begin(), s.tokens.end());
  const at::Tensor want =
      reference::target_forward(k.c, t, at::tensor(text, at::kLong).unsqueeze(0)).features[0];
  const at::Tensor got = rec.taps();  // (committed, L*H)
  RC_ASSERT(got.size(0) <= want.size(0));
  RC_ASSERT(got.size(0) >= int64_t(k.prompt.size()));
  RC_ASSERT(at::allclose(got, want.narrow(0, 0, got.size(0)), 1e-10, 1e-10));
}

TEST(Speculative, BadPromptsAreRefusedNamingTheLimit) {
  Config c = testing::small_config();
  const TargetWeights t = make_target(c);
  DecodeOptions o{4, 8, 6, -1, -1, 0};
  auto message = [&](const std::vector<int64_t>& prompt) {
    try {
      greedy_decode(c, t, prompt, o);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({1, 2, 3, 4, 5, 6, 7}).find("7 tokens, more than the context limit 6"),
            std::string::npos);
  EXPECT_NE(message({}).find("empty"), std::string::npos);
  EXPECT_NE(message({1, c.target.vocab_size}).find("token 1 of the prompt"), std::string::npos);
  // A prompt exactly at the limit generates nothing; one below it up to the limit.
  EXPECT_TRUE(greedy_decode(c, t, {1, 2, 3, 4, 5, 6}, o).tokens.empty());
  EXPECT_EQ(greedy_decode(c, t, {1, 2, 3, 4}, o).tokens.size(), 2u);
}

}  // namespace
}  // namespace dflash::decode

// Served acceptance over a set of prompts; see served_eval.h.
#include "decode/served_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "optimized/target.h"

namespace dflash::decode {
void add_decode(ServedRun& run, const DecodeResult& r, int64_t bs) {
  run.tokens += int64_t(r.tokens.size());
  run.rounds += int64_t(r.accepted.size());
  run.target_forwards += r.target_forwards;
  run.target_s += r.target_s, run.drafter_s += r.drafter_s, run.total_s += r.total_s;
  run.histogram.resize(size_t(bs), 0);
  run.reached.resize(size_t(bs - 1), 0);
  for (size_t i = 0; i < r.accepted.size(); ++i) {
    run.nodes += r.nodes[i];
    if (r.slots[i] != bs - 1) continue;  // a shortened last round
    ++run.full_rounds;
    const bool bonus = !(r.stopped && i + 1 == r.accepted.size());  // a stop ends without one
    const int64_t n = r.accepted[i] + (bonus ? 1 : 0);              // committed, >= 1
    run.committed += n;
    ++run.histogram[size_t(n - 1)];
    for (int64_t k = 0; k < r.accepted[i]; ++k) ++run.reached[size_t(k)];
  }
}

namespace {

// SPEC step 10 on the served texts: every generated position with a next
// generated token is an anchor (keep = true), the labels are the target's
// own greedy tokens, tau and per-slot accuracy from the run's step.
StepOutputs teacher_forced(const ServedModels& m, const Config& c, int64_t bs,
                           const std::vector<int64_t>& prompt, const std::vector<int64_t>& gen) {
  std::vector<int64_t> ids = prompt;
  ids.insert(ids.end(), gen.begin(), gen.end());
  const int64_t S = int64_t(ids.size()), P = int64_t(prompt.size());
  std::vector<int64_t> anchors;
  for (int64_t a = P; a + 1 < S; ++a) anchors.push_back(a);
  const auto dev = m.target->embed_tokens.device();
  StepInputs in;
  in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0).to(dev);  // (1, S)
  in.loss_mask = (at::arange(S, at::kLong) >= P).unsqueeze(0).to(dev);
  const reference::TargetOutputs t = optimized::target_forward(c, *m.target, in.input_ids);
  in.features = t.features, in.target_hidden = t.final_hidden;  // as the training loop's inputs
  const int64_t N = int64_t(anchors.size());
  in.anchors = {at::tensor(anchors, at::kLong).unsqueeze(0).to(dev),
                at::ones({1, N}, at::kBool).to(dev)};  // (1, N)
  at::NoGradGuard ng;
  Config cc = c;
  // tau needs neither the teacher nor the loss weights: CE alone, uniform.
  const LossConfig tau_loss{1.0, 0.0, 1.0, 0.0, c.loss.chunk_size};
  cc.loss = tau_loss;
  cc.data.block_size = bs;
  return m.tau_fn(cc, *m.drafter, m.target->frozen(), in);
}

}  // namespace

double ServedRun::acceptance() const {
  return full_rounds > 0 ? double(committed) / double(full_rounds) : 0.0;
}

nlohmann::json ServedRun::to_json() const {
  std::vector<double> rate;
  for (int64_t r : reached) rate.push_back(full_rounds > 0 ? double(r) / double(full_rounds) : 0);
  return {{"budget", budget},
          {"acceptance", acceptance()},
          {"tokens", tokens},
          {"rounds", rounds},
          {"full_rounds", full_rounds},
          {"target_forwards", target_forwards},
          {"tokens_per_target_forward",
           target_forwards > 0 ? double(tokens) / double(target_forwards) : 0.0},
          {"mean_nodes", rounds > 0 ? double(nodes) / double(rounds) : 0.0},
          {"histogram", histogram},
          {"acceptance_by_position", rate},
          {"target_s", target_s},
          {"drafter_s", drafter_s},
          {"total_s", total_s},
          {"tokens_per_s", total_s > 0 ? double(tokens) / total_s : 0.0},
          {"mismatched_prompts", mismatched_prompts}};
}

int64_t ServedReport::mismatches() const {
  int64_t n = block.mismatched_prompts;
  for (const ServedRun& t : trees) n += t.mismatched_prompts;
  return n;
}

nlohmann::json ServedReport::to_json() const {
  nlohmann::json t = nlohmann::json::array();
  for (const ServedRun& r : trees) t.push_back(r.to_json());
  nlohmann::json j = {{"prompts", prompts},
                      {"block_size", block_size},
                      {"block", block.to_json()},
                      {"trees", t},
                      {"tau", tau},
                      {"tau_accuracy", tau_accuracy},
                      {"greedy_tokens", greedy_tokens},
                      {"greedy_s", greedy_s}};
  if (greedy_s > 0 && block.total_s > 0) {
    j["greedy_tokens_per_s"] = double(greedy_tokens) / greedy_s;
    j["speedup"] = greedy_s / block.total_s;
  }
  return j;
}

std::string ServedReport::text() const {
  std::string s = fmt::format(
      "served acceptance (block {}): {:.3f} tokens committed per verification round over {} "
      "rounds of {} prompts (teacher-forced tau on the same texts: {:.3f})\n",
      block_size, block.acceptance(), block.full_rounds, prompts, tau);
  std::vector<std::string> hist, pos;
  for (size_t j = 0; j < block.histogram.size(); ++j)
    hist.push_back(fmt::format("{}:{}", j + 1, block.histogram[j]));
  for (size_t k = 0; k < block.reached.size(); ++k)
    pos.push_back(fmt::format("{:.2f}", block.full_rounds > 0
                                            ? double(block.reached[k]) / double(block.full_rounds)
                                            : 0.0));
  s += fmt::format("  committed per round: {}\n  slot accepted (k = 1..{}): {}\n",
                   fmt::join(hist, " "), block_size - 1, fmt::join(pos, " "));
  for (const ServedRun& t : trees)
    s += fmt::format("  tree budget {:>3}: acceptance {:.3f}, {:.1f} nodes verified per round\n",
                     t.budget, t.acceptance(),
                     t.rounds > 0 ? double(t.nodes) / double(t.rounds) : 0.0);
  if (greedy_s > 0 && block.total_s > 0) {
    s += fmt::format(
        "  speed: greedy {:.0f} tok/s, speculative {:.0f} tok/s ({:.2f}x); speculative time "
        "{:.0f}% target, {:.0f}% drafter\n",
        double(greedy_tokens) / greedy_s, double(block.tokens) / block.total_s,
        greedy_s / block.total_s, 100 * block.target_s / block.total_s,
        100 * block.drafter_s / block.total_s);
    for (const ServedRun& t : trees)
      s += fmt::format("  tree budget {:>3}: {:.0f} tok/s ({:.2f}x)\n", t.budget,
                       double(t.tokens) / t.total_s, greedy_s / t.total_s);
  }
  if (mismatches() > 0)
    s += fmt::format(
        "  WARNING: {} decodings differ from plain greedy (block: against greedy; trees: against "
        "block): not lossless\n",
        mismatches());
  return s;
}

int64_t context_limit(const Config& c) {
  return c.target.max_position_embeddings > 0 ? c.target.max_position_embeddings : c.data.seq_len;
}

std::vector<std::vector<int64_t>> served_prompts(const Config& c, const data::Dataset& eval,
                                                 int64_t n) {
  std::vector<std::vector<int64_t>> out;
  const int64_t rows_max = eval.size() > 0 ? eval.size() : n;
  for (int64_t i = 0; int64_t(out.size()) < std::min(n, rows_max); ++i) {
    const data::MicroBatch mb = data::eval_batch(c, eval, i);
    for (int64_t r = 0; r < mb.input_ids.size(0) && int64_t(out.size()) < std::min(n, rows_max);
         ++r) {
      const at::Tensor ids = mb.input_ids[r].to(at::kCPU).contiguous();
      const at::Tensor mask = mb.loss_mask[r].to(at::kCPU);
      const int64_t S = ids.size(0);
      int64_t first = 0;
      while (first < S && !mask[first].item<bool>()) ++first;
      const int64_t len = first >= 1 && first < S ? first : std::min(c.data.prompt_len, S);
      out.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + len);
    }
  }
  return out;
}

ServedReport served_eval(const ServedModels& m, const std::vector<std::vector<int64_t>>& prompts,
                         const ServedOptions& o) {
  const Config& c = *m.c;
  const int64_t bs = o.block_size;
  ServedReport rep;
  rep.prompts = int64_t(prompts.size()), rep.block_size = bs;
  DecodeOptions d{bs, o.max_new_tokens, o.max_context, c.data.mask_token_id, o.stop_token, 0};
  for (int64_t b : o.budgets) rep.trees.push_back(ServedRun{b});
  int64_t accept_sum = 0, kept = 0;
  std::vector<int64_t> correct(size_t(bs), 0), counted(size_t(bs), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = fmt::format("held-out prompt {}", i);
    check_decode_inputs(c, prompts[i], d, what);
    d.tree_budget = 0;
    DFlashDrafter block_drafter(c, *m.drafter, m.target->frozen(), bs);
    const DecodeResult block = speculative_decode(c, *m.target, block_drafter, prompts[i], d);
    add_decode(rep.block, block, bs);
    if (o.plain_greedy) {
      const DecodeResult g = greedy_decode(c, *m.target, prompts[i], d);
      rep.greedy_tokens += int64_t(g.tokens.size()), rep.greedy_s += g.total_s;
      rep.block.mismatched_prompts += g.tokens != block.tokens;
    }
    for (ServedRun& t : rep.trees) {
      d.tree_budget = t.budget;
      DFlashDrafter tree_drafter(c, *m.drafter, m.target->frozen(), bs);
      const DecodeResult r = speculative_decode(c, *m.target, tree_drafter, prompts[i], d);
      add_decode(t, r, bs);
      t.mismatched_prompts += r.tokens != block.tokens;
    }
    if (block.tokens.size() < 2) continue;
    const StepOutputs so = teacher_forced(m, c, bs, prompts[i], block.tokens);
    accept_sum += so.accept_sum.item<int64_t>(), kept += so.kept_blocks.item<int64_t>();
    for (int64_t k = 0; k < std::min<int64_t>(bs, so.correct.size(0)); ++k)
      correct[size_t(k)] += so.correct[k].item<int64_t>(),
          counted[size_t(k)] += so.counted[k].item<int64_t>();
  }
  rep.tau = kept > 0 ? 1.0 + double(accept_sum) / double(kept) : 1.0;
  for (int64_t k = 0; k < bs; ++k)
    rep.tau_accuracy.push_back(
        counted[size_t(k)] > 0 ? double(correct[size_t(k)]) / double(counted[size_t(k)]) : 0.0);
  return rep;
}

}  // namespace dflash::decode

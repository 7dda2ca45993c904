#include "harness/generators.h"

#include <algorithm>

namespace dflash {
void showValue(const Config& c, std::ostream& os) { os << "\n" << config_to_toml(c); }
}  // namespace dflash

namespace dflash::harness {
namespace {

LayerShape gen_shape(int64_t hidden) {
  LayerShape s;
  s.hidden_size = hidden;
  s.num_key_value_heads = *rc::gen::inRange<int64_t>(1, 3);
  s.num_attention_heads = s.num_key_value_heads * *rc::gen::inRange<int64_t>(1, 3);
  s.head_dim = 2 * *rc::gen::inRange<int64_t>(1, 4);
  s.intermediate_size = *rc::gen::inRange<int64_t>(4, 25);
  s.rope_theta = *rc::gen::element(10000.0, 1e6);
  s.rms_norm_eps = 1e-6;
  return s;
}

std::vector<int64_t> gen_taps(int64_t num_target_layers) {
  const auto n = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(num_target_layers, 3) + 1);
  std::vector<int64_t> taps;
  for (int64_t i = 0; i < n; ++i) taps.push_back(*rc::gen::inRange<int64_t>(0, num_target_layers));
  std::sort(taps.begin(), taps.end());  // the tap rule: distinct and ascending
  taps.erase(std::unique(taps.begin(), taps.end()), taps.end());
  return taps;
}

// One loss-mask row of length S.
std::vector<int64_t> gen_mask_row(int64_t S) {
  std::vector<int64_t> m(size_t(S), 0);
  switch (*rc::gen::inRange(0, 4)) {
    case 0:  // response with holes
      for (auto& x : m) x = *rc::gen::inRange(0, 10) < 7;
      break;
    case 1:  // no anchor candidate at all
      break;
    case 2:  // full
      std::fill(m.begin(), m.end(), 1);
      break;
    default:  // candidates only at 0 and S-2
      m[0] = m[1] = 1;
      m[size_t(S - 2)] = m[size_t(S - 1)] = 1;
      break;
  }
  return m;
}

}  // namespace

// The objectives and the weighting as configuration axes (docs/LOSSES.md):
// each distillation term on about half the cases, JSD's beta at both
// endpoints and inside, every weighting; never a loss identically 0.
void gen_objectives(LossConfig& l) {
  l.ce_weight = *rc::gen::element(0.0, 0.5, 1.0);
  l.kl_weight = *rc::gen::element(0.0, 0.0, 0.25, 1.0);
  l.reverse_kl_weight = *rc::gen::element(0.0, 0.0, 0.3, 1.0);
  l.jsd_weight = *rc::gen::element(0.0, 0.0, 0.4, 1.0);
  l.jsd_beta = *rc::gen::element(0.0, 0.1, 0.5, 0.9, 1.0);
  l.tv_weight = *rc::gen::element(0.0, 0.0, 0.5, 1.0);
  if (l.ce_weight == 0 && !l.uses_teacher()) l.kl_weight = 1.0;
  l.temperature = *rc::gen::element(0.5, 1.0, 2.0);
  l.weighting = *rc::gen::element(Weighting::kDecay, Weighting::kDecay, Weighting::kDpace,
                                  Weighting::kUniform);
  l.gamma = l.weighting == Weighting::kDecay ? *rc::gen::element(0.0, 0.5, 4.0) : 0.0;
  l.dpace_alpha = l.weighting == Weighting::kDpace ? *rc::gen::element(0.5, 0.2, 1.0) : 0.5;
}

rc::Gen<Config> gen_micro_config() {
  return rc::gen::exec([] {
    Config c;
    c.path = "<generated>";
    c.target.vocab_size = *rc::gen::inRange<int64_t>(8, 41);
    c.target.num_hidden_layers = *rc::gen::inRange<int64_t>(1, 5);
    c.target.shape = gen_shape(*rc::gen::element<int64_t>(8, 12, 16));
    c.target.tie_word_embeddings = *rc::gen::arbitrary<bool>();
    c.target.init_std = 0.2;
    c.target.norm_init_jitter = 0.1;
    c.drafter.num_hidden_layers = *rc::gen::inRange<int64_t>(1, 3);
    c.drafter.shape = gen_shape(c.target.shape.hidden_size);
    c.drafter.target_layer_ids = gen_taps(c.target.num_hidden_layers);
    // The last layer is a legal tap for training (opted in), only not servable.
    c.drafter.allow_last_layer_tap = true;
    c.drafter.init_std = 0.2;
    c.drafter.norm_init_jitter = 0.1;
    c.data.batch_size = *rc::gen::inRange<int64_t>(1, 4);
    c.data.seq_len = *rc::gen::inRange<int64_t>(3, 15);
    c.data.block_size = *rc::gen::inRange<int64_t>(2, 6);
    c.data.max_anchors = *rc::gen::inRange<int64_t>(1, 5);
    c.data.mask_token_id = *rc::gen::inRange<int64_t>(0, c.target.vocab_size);
    gen_objectives(c.loss);
    c.run.seed = *rc::gen::inRange<uint64_t>(0, 1000000);
    c.run.dtype = DType::kFloat64;
    validate_config(c);
    return c;
  });
}

rc::Gen<Config> gen_step_config() {
  return rc::gen::exec([] {
    Config c = *gen_micro_config();
    const int64_t Qmax = c.data.max_anchors * c.data.block_size;
    c.loss.chunk_size =
        *rc::gen::oneOf(rc::gen::just<int64_t>(0), rc::gen::just<int64_t>(1),
                        // 2 or 3: a few counted rows leave a ragged last chunk
                        rc::gen::inRange<int64_t>(2, 4), rc::gen::inRange<int64_t>(2, Qmax + 1),
                        rc::gen::just<int64_t>(Qmax + 7));
    c.optimized.chunked_loss = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
    c.optimized.sparse_attention = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
    c.optimized.checkpoint_layers = *rc::gen::arbitrary<bool>();
    c.optimized.attention_tile = *rc::gen::inRange<int64_t>(1, c.data.seq_len + 2);
    // Both implementations of the loss and the attention (optimized/kernels.h).
    c.optimized.kernels = *rc::gen::element<std::string>("auto", "host", "aten");
    c.run.dtype = *rc::gen::element(DType::kFloat64, DType::kFloat32, DType::kBFloat16);
    // A per-head RMSNorm over 2 elements is so ill-conditioned that bf16
    // rounding alone moves its gradients by tens of percent: bf16 cases use
    // real-model head dims; float64/float32 cases keep the head_dim-2 corner.
    if (c.run.dtype == DType::kBFloat16)
      c.drafter.shape.head_dim = *rc::gen::element<int64_t>(8, 16);
    c.data.source = "inline";
    for (int64_t b = 0; b < c.data.batch_size; ++b) {
      c.data.loss_mask.push_back(gen_mask_row(c.data.seq_len));
      std::vector<int64_t> ids;
      for (int64_t s = 0; s < c.data.seq_len; ++s) {
        const int64_t t = *rc::gen::inRange<int64_t>(0, c.target.vocab_size - 1);
        ids.push_back(t >= c.data.mask_token_id ? t + 1 : t);  // never the mask token
      }
      c.data.input_ids.push_back(ids);
    }
    validate_config(c);
    return c;
  });
}

}  // namespace dflash::harness

#include "optimized/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <dflash_torch_features.h>  // generated: cmake/Torch.cmake

#include <algorithm>
#include <mutex>
#include <unordered_set>

namespace dflash::optimized {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

[[noreturn]] void violation(const std::string& region, const std::string& what) {
  throw std::runtime_error(fmt::format("checkpoint '{}': {}", region, what));
}

// The default generators a region may draw from: the CPU's, and that of
// every other device its named tensors live on (on CUDA, the generator of
// the device in use). Their states are saved at forward and put back for
// the recomputation, so dropout inside a region draws the same numbers.
at::Generator default_generator(const c10::Device& d) {
  return d.is_cpu() ? at::detail::getDefaultCPUGenerator()
                    : at::globalContext().defaultGenerator(d);
}

struct RngStates {
  std::vector<std::pair<c10::Device, at::Tensor>> states;  // (device, generator state)
};

RngStates rng_states(const std::vector<c10::Device>& devices) {
  RngStates r;
  for (const c10::Device& d : devices) {
    at::Generator gen = default_generator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    r.states.emplace_back(d, gen.get_state());
  }
  return r;
}

void set_rng_states(const RngStates& r) {
  for (const auto& [d, state] : r.states) {
    at::Generator gen = default_generator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

std::vector<c10::Device> rng_devices(const CheckpointContract& c) {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    c10::Device d = t.device();
    if (d.type() == c10::kCUDA && !d.has_index()) d = c10::Device(c10::kCUDA, 0);
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  };
  for (const Named& n : c.grad_inputs) add(n.tensor);
  for (const Named& n : c.inputs) add(n.tensor);
  for (const Named& n : c.params) add(n.tensor);
  return devices;
}

// Puts the generators back to `state` for its lifetime, then restores the
// states it found, even if the recomputation throws.
struct RngReplay {
  RngStates saved;
  explicit RngReplay(const RngStates& state) {
    std::vector<c10::Device> devices;
    for (const auto& s : state.states) devices.push_back(s.first);
    saved = rng_states(devices);
    set_rng_states(state);
  }
  ~RngReplay() { set_rng_states(saved); }
};

void check_contract(const CheckpointContract& c) {
  for (const Named& n : c.grad_inputs) {
    if (!n.tensor.requires_grad())
      violation(c.region, fmt::format("input '{}' must receive a gradient but does not require "
                                      "grad (detached, or computed under no-grad?)",
                                      n.name));
    if (n.activation && n.tensor.is_leaf())
      violation(c.region, fmt::format("input '{}' is an activation but is a leaf: it was "
                                      "detached from the graph, so nothing before it would "
                                      "get a gradient",
                                      n.name));
  }
  for (const Named& n : c.inputs)
    if (n.tensor.requires_grad())
      violation(c.region, fmt::format("input '{}' is declared non-differentiable but requires "
                                      "grad: its gradient would be dropped",
                                      n.name));
  for (const Named& p : c.params)
    if (!p.tensor.requires_grad())
      violation(c.region, fmt::format("parameter '{}' must receive a gradient but does not "
                                      "require grad",
                                      p.name));
}

struct CheckpointNode : public Node {
  std::string region;
  CheckpointFn fn;
  std::vector<SavedVariable> grad_inputs, inputs;
  std::vector<std::string> names;  // grad inputs, then params: one per next edge
  std::vector<at::Tensor> params;
  RngStates rng_state;

  std::string name() const override { return "CheckpointBackward[" + region + "]"; }

  void release_variables() override {
    grad_inputs.clear();
    inputs.clear();
    params.clear();
    fn = nullptr;  // its captures (RoPE tables, cast weights) go with it
  }

  // Every trainable leaf and every outside node the recomputed graph reaches
  // must be one of the named tensors.
  void check_closed(const at::Tensor& out, const std::vector<at::Tensor>& named) const {
    std::unordered_set<const Node*> boundary;
    for (const at::Tensor& t : named)
      boundary.insert(torch::autograd::impl::gradient_edge(t).function.get());
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack{out.grad_fn().get()};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      if (!n || boundary.count(n) || !seen.insert(n).second) continue;
      if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(n))
        violation(region, fmt::format("uses a trainable tensor of shape ({}) that its contract "
                                      "does not name: it would silently get no gradient",
                                      fmt::join(acc->variable.sizes(), ", ")));
      // Sequence numbers are per thread: this catches outside nodes built on
      // the thread running backward (the CPU case); on other threads' nodes
      // it is silent rather than wrong.
      if (n->sequence_nr() < recompute_start_)
        violation(region, "uses a tensor with a graph from outside the region (" + n->name() +
                              ") that its contract does not name");
      for (const Edge& e : n->next_edges()) stack.push_back(e.function.get());
    }
  }

  variable_list apply(variable_list&& grads) override {
    at::AutoGradMode enable(true);
    std::vector<at::Tensor> gi, in;
    for (const SavedVariable& s : grad_inputs)
      gi.push_back(s.unpack().detach().requires_grad_(true));
    for (const SavedVariable& s : inputs) in.push_back(s.unpack());
    TORCH_CHECK(fn, "checkpoint '", region, "': backward ran twice without retain_graph");
    at::Tensor out;
    {
      RngReplay replay(rng_state);
      recompute_start_ = at::sequence_number::peek();
      out = fn(gi, in);
    }
    std::vector<at::Tensor> wrt = gi;
    wrt.insert(wrt.end(), params.begin(), params.end());
    check_closed(out, wrt);
    variable_list g = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                            /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < g.size(); ++i)
      if (!g[i].defined())
        violation(region, fmt::format("'{}' received no gradient in the recomputation (is it "
                                      "used by the region?)",
                                      names[i]));
    return g;
  }

 private:
  uint64_t recompute_start_ = 0;
};

}  // namespace

at::Tensor checkpoint(const CheckpointContract& c, const CheckpointFn& fn) {
  std::vector<at::Tensor> gi, in;
  for (const Named& n : c.grad_inputs) gi.push_back(n.tensor);
  for (const Named& n : c.inputs) in.push_back(n.tensor);
  if (!at::GradMode::is_enabled()) return fn(gi, in);  // evaluation: nothing to save
  check_contract(c);

#if DFLASH_TORCH_SHARED_NODES  // how this libtorch holds autograd nodes (cmake/Torch.cmake)
  auto node = std::shared_ptr<CheckpointNode>(new CheckpointNode(), torch::autograd::deleteNode);
#else
  auto node = c10::make_intrusive<CheckpointNode>();
#endif
  node->region = c.region;
  node->fn = fn;
  node->rng_state = rng_states(rng_devices(c));
  torch::autograd::edge_list edges;
  for (const Named& n : c.grad_inputs) {
    node->grad_inputs.emplace_back(n.tensor, /*is_output=*/false);
    node->names.push_back(n.name);
    edges.push_back(torch::autograd::impl::gradient_edge(n.tensor));
  }
  for (const Named& n : c.inputs) node->inputs.emplace_back(n.tensor, false);
  for (const Named& p : c.params) {
    node->params.push_back(p.tensor);
    node->names.push_back(p.name);
    edges.push_back(torch::autograd::impl::gradient_edge(p.tensor));
  }
  node->set_next_edges(std::move(edges));

  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = fn(gi, in);
    if (out.is_view()) out = out.clone();  // history cannot be set on a view
  }
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace dflash::optimized

// TOML/JSON -> Config, with messages that name file, key, expectation and
// finding. Parsing (types, unknown keys) and validation (values, cross-field
// rules) are separate passes so configs built in code get the same checks.
#include "core/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/files.h"

namespace dflash {

const char* weighting_name(Weighting w) {
  switch (w) {
    case Weighting::kDecay:
      return "decay";
    case Weighting::kDpace:
      return "dpace";
    case Weighting::kUniform:
      return "uniform";
  }
  return "?";
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

namespace {

std::string describe(const toml::node& n) {
  std::ostringstream os;
  switch (n.type()) {
    case toml::node_type::string:
      os << "string \"" << *n.value<std::string>() << '"';
      break;
    case toml::node_type::integer:
      os << "integer " << *n.value<int64_t>();
      break;
    case toml::node_type::floating_point:
      os << "float " << *n.value<double>();
      break;
    case toml::node_type::boolean:
      os << "boolean " << (*n.value<bool>() ? "true" : "false");
      break;
    case toml::node_type::array:
      os << "an array";
      break;
    case toml::node_type::table:
      os << "a table";
      break;
    default:
      os << "a date/time";
      break;
  }
  if (n.source().begin.line > 0) os << " (line " << n.source().begin.line << ")";
  return os.str();
}

// One [section] of the file: typed getters that remember which keys were
// read, so anything left over is reported as unknown.
class Section {
 public:
  Section(const toml::table* t, const std::string& label, std::string name)
      : t_(t), label_(label), name_(std::move(name)) {}

  bool has(const char* key) const { return t_ && t_->contains(key); }

  int64_t integer(const char* key, std::optional<int64_t> def) {
    const toml::node* n = find(key, def.has_value());
    if (!n) return *def;
    if (!n->is_integer()) fail(key, "an integer", describe(*n));
    return *n->value<int64_t>();
  }
  double number(const char* key, std::optional<double> def) {
    const toml::node* n = find(key, def.has_value());
    if (!n) return *def;
    if (!n->is_number()) fail(key, "a number", describe(*n));
    double v = *n->value<double>();
    if (!std::isfinite(v)) fail(key, "a finite number", describe(*n));
    return v;
  }
  bool boolean(const char* key, bool def) {
    const toml::node* n = find(key, true);
    if (!n) return def;
    if (!n->is_boolean()) fail(key, "true or false", describe(*n));
    return *n->value<bool>();
  }
  std::string string(const char* key, std::optional<std::string> def) {
    const toml::node* n = find(key, def.has_value());
    if (!n) return *def;
    if (!n->is_string()) fail(key, "a string", describe(*n));
    return *n->value<std::string>();
  }
  std::vector<int64_t> int_list(const char* key, std::vector<int64_t> def) {
    const toml::node* n = find(key, true);
    if (!n) return def;
    std::vector<int64_t> out;
    if (!n->is_array()) fail(key, "an array of integers", describe(*n));
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_integer()) fail(key, "an array of integers", "an element that is " + describe(e));
      out.push_back(*e.value<int64_t>());
    }
    return out;
  }
  // An array of arrays of integers (rows of a batch).
  std::vector<std::vector<int64_t>> int_matrix(const char* key) {
    const toml::node* n = find(key, true);
    if (!n) return {};
    const char* what = "an array of arrays of integers";
    if (!n->is_array()) fail(key, what, describe(*n));
    std::vector<std::vector<int64_t>> out;
    for (const toml::node& row : *n->as_array()) {
      if (!row.is_array()) fail(key, what, "a row that is " + describe(row));
      out.emplace_back();
      for (const toml::node& e : *row.as_array()) {
        if (!e.is_integer()) fail(key, what, "an element that is " + describe(e));
        out.back().push_back(*e.value<int64_t>());
      }
    }
    return out;
  }

  // A number, or an array of numbers (one per rank).
  std::vector<double> number_list(const char* key) {
    const toml::node* n = find(key, true);
    if (!n) return {};
    if (n->is_number()) return {*n->value<double>()};
    if (!n->is_array()) fail(key, "a number or an array of numbers", describe(*n));
    std::vector<double> out;
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_number()) fail(key, "an array of numbers", "an element that is " + describe(e));
      out.push_back(*e.value<double>());
    }
    return out;
  }

  void reject_unknown() const {
    if (!t_) return;
    for (auto&& [k, v] : *t_) {
      std::string key(k.str());
      if (!seen_.count(key)) {
        std::string known;
        for (const auto& s : seen_) known += (known.empty() ? "" : ", ") + s;
        fail(key.c_str(), "one of the known keys (" + known + ")",
             "unknown key" + (v.source().begin.line > 0
                                  ? fmt::format(" (line {})", v.source().begin.line)
                                  : ""));
      }
    }
  }

 private:
  const toml::node* find(const char* key, bool optional) {
    seen_.insert(key);
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n && !optional) fail(key, "a value (required key)", "nothing");
    return n;
  }
  [[noreturn]] void fail(const char* key, const std::string& expected,
                         const std::string& found) const {
    throw ConfigError(
        fmt::format("{}: {}.{}: expected {}, found {}", label_, name_, key, expected, found));
  }

  const toml::table* t_;
  const std::string& label_;
  std::string name_;
  std::set<std::string> seen_;
};

const toml::table* section_table(const toml::table& root, const std::string& label,
                                 const char* name, bool required) {
  const toml::node* n = root.get(name);
  if (!n) {
    if (required)
      throw ConfigError(
          fmt::format("{}: [{}]: expected a section, found nothing (required)", label, name));
    return nullptr;
  }
  if (!n->is_table())
    throw ConfigError(
        fmt::format("{}: {}: expected a [{}] section, found {}", label, name, name, describe(*n)));
  return n->as_table();
}

DType parse_dtype(const std::string& s, const std::string& label) {
  if (s == "float32") return DType::kFloat32;
  if (s == "float64") return DType::kFloat64;
  if (s == "bfloat16") return DType::kBFloat16;
  throw ConfigError(fmt::format(
      "{}: run.dtype: expected \"float32\", \"float64\" or \"bfloat16\", found \"{}\"", label, s));
}

Weighting parse_weighting(const std::string& s, const std::string& label) {
  for (Weighting w : {Weighting::kDecay, Weighting::kDpace, Weighting::kUniform})
    if (s == weighting_name(w)) return w;
  throw ConfigError(fmt::format(
      "{}: loss.weighting: expected \"decay\", \"dpace\" or \"uniform\", found \"{}\"", label, s));
}

void check_sections(const toml::table& root, const std::string& label) {
  static const std::set<std::string> kSections = {"target", "drafter",   "data",     "loss",
                                                  "run",    "optimized", "topology", "train"};
  for (auto&& [k, v] : root) {
    std::string key(k.str());
    if (!kSections.count(key))
      throw ConfigError(
          fmt::format("{}: {}: expected one of the sections [target], [drafter], [data], [loss], "
                      "[run], [optimized], [topology], [train], found unknown key",
                      label, key));
  }
}

// Field `f` of section `s` into `c`. An optional key's default is its value
// in `dflt`: a default Config with an hf target's config.json fields and the
// drafter's shape (the target's) filled in.
void read_field(Section& s, const ConfigField& f, Config& c, const Config& dflt, bool hf,
                const std::string& label) {
  using Type = ConfigField::Type;
  using Need = ConfigField::Need;
  const char* name = std::strchr(f.key, '.') + 1;
  void* p = f.member(c);
  const void* d = f.in(dflt);
  const bool required =
      (f.need == Need::kRequired && !(hf && f.from_hf)) || (f.need == Need::kWithHf && hf);
  auto dflt_of = [&](auto v) {
    return required ? std::optional<decltype(v)>() : std::optional<decltype(v)>(v);
  };
  switch (f.type) {
    case Type::kInt:
      *static_cast<int64_t*>(p) = s.integer(name, dflt_of(*static_cast<const int64_t*>(d)));
      break;
    case Type::kReal:
      *static_cast<double*>(p) = s.number(name, dflt_of(*static_cast<const double*>(d)));
      break;
    case Type::kBool:
      *static_cast<bool*>(p) = s.boolean(name, *static_cast<const bool*>(d));
      break;
    case Type::kString:
      *static_cast<std::string*>(p) = s.string(name, dflt_of(*static_cast<const std::string*>(d)));
      break;
    case Type::kInts:
      *static_cast<std::vector<int64_t>*>(p) =
          s.int_list(name, *static_cast<const std::vector<int64_t>*>(d));
      break;
    case Type::kReals:
      *static_cast<std::vector<double>*>(p) = s.number_list(name);
      break;
    case Type::kRows:
      *static_cast<std::vector<std::vector<int64_t>>*>(p) = s.int_matrix(name);
      break;
    case Type::kSeed: {
      const int64_t seed = s.integer(name, int64_t(*static_cast<const uint64_t*>(d)));
      if (seed < 0)
        throw ConfigError(
            fmt::format("{}: {}: expected an integer >= 0, found {}", label, f.key, seed));
      *static_cast<uint64_t*>(p) = uint64_t(seed);
      break;
    }
    case Type::kDType:
      *static_cast<DType*>(p) =
          parse_dtype(s.string(name, dtype_name(*static_cast<const DType*>(d))), label);
      break;
    case Type::kWeighting:
      *static_cast<Weighting*>(p) =
          parse_weighting(s.string(name, weighting_name(*static_cast<const Weighting*>(d))), label);
      break;
  }
}

// Every key of [section] (config_fields()).
void read_fields(Section& s, const std::string& section, Config& c, const Config& dflt, bool hf,
                 const std::string& label) {
  const std::string prefix = section + ".";
  for (const ConfigField& f : config_fields())
    if (f.need != ConfigField::Need::kHfOnly && std::string(f.key).rfind(prefix, 0) == 0)
      read_field(s, f, c, dflt, hf, label);
}

// target.source = "hf": a key the TOML repeats from <path>/config.json must agree.
void check_same_as_hf(const Config& c, const Config& hf, const std::string& label) {
  for (const ConfigField& f : config_fields()) {
    if (!f.from_hf) continue;
    const nlohmann::json mine = field_json(f, c), theirs = field_json(f, hf);
    if (mine == theirs) continue;
    auto text = [](const nlohmann::json& v) {
      return v.is_number_float() ? fmt::format("{}", v.get<double>()) : v.dump();
    };
    throw ConfigError(fmt::format("{}: {}: expected {} (from {}/config.json), found {}", label,
                                  f.key, text(theirs), hf.target.path, text(mine)));
  }
}

// [target]; with source = "hf" its config.json supplies the model's keys.
void read_target(const toml::table& root, Config& c, Config& dflt, const std::string& label) {
  Section t(section_table(root, label, "target", true), label, "target");
  const bool hf = t.string("source", "fixture") == "hf";
  if (hf) {
    const std::string path = t.string("path", std::nullopt);
    try {
      dflt.target = read_hf_config(path);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("{}: target.path: {}", label, e.what()));
    }
  }
  read_fields(t, "target", c, dflt, hf, label);
  if (hf) {
    check_same_as_hf(c, dflt, label);
    c.target.max_position_embeddings = dflt.target.max_position_embeddings;
  }
  c.target.shape.qk_norm = c.target.architecture != "llama";  // Llama has no q/k norm
  t.reject_unknown();
}

// [drafter]: shaped like the target's unless given; the tapped layers by
// SPEC.md's rule unless given.
void read_drafter(const toml::table& root, Config& c, Config& dflt, const std::string& label) {
  Section d(section_table(root, label, "drafter", true), label, "drafter");
  // Only the shape keys are the target's: qk_norm and rope_scaling are not
  // keys of [drafter], so the drafter keeps the Hugging Face DFlash layout
  // (q/k norm, plain RoPE) whatever the target.
  dflt.drafter.shape = c.target.shape;
  read_fields(d, "drafter", c, dflt, false, label);
  // The default ids are computed only for a layer count inside its range:
  // validation reports any other before anything is sized by it.
  if (!d.has("target_layer_ids") &&
      config_range("drafter.num_hidden_layers").contains_int(c.drafter.num_hidden_layers) &&
      config_range("target.num_hidden_layers").contains_int(c.target.num_hidden_layers))
    c.drafter.target_layer_ids =
        default_target_layer_ids(c.target.num_hidden_layers, c.drafter.num_hidden_layers);
  d.reject_unknown();
}

Config from_table(const toml::table& root, const std::string& label) {
  check_sections(root, label);
  Config c, dflt;
  c.path = label;
  read_target(root, c, dflt, label);
  read_drafter(root, c, dflt, label);
  for (const char* name : {"data", "loss", "run", "optimized", "topology", "train"}) {
    Section s(section_table(root, label, name, std::strcmp(name, "data") == 0), label, name);
    read_fields(s, name, c, dflt, false, label);
    s.reject_unknown();
  }
  // One memory figure for every rank.
  TopologyConfig& tp = c.topology;
  if (tp.device_memory_gb.size() == 1 && tp.world_size > 1 &&
      config_range("topology.world_size").contains_int(tp.world_size))
    tp.device_memory_gb.assign(size_t(tp.world_size), tp.device_memory_gb[0]);
  validate_config(c);
  return c;
}

toml::table parse_toml(const std::string& text, const std::string& label) {
  try {
    return toml::parse(text, label);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}: line {}, column {}: not valid TOML: {}", label,
                                  e.source().begin.line, e.source().begin.column, e.description()));
  }
}

}  // namespace

Config parse_config_toml(const std::string& text, const std::string& label) {
  return from_table(parse_toml(text, label), label);
}

namespace {

std::string read_config_file(const std::string& path) {
  return read_whole_file<ConfigError>(path, "config file");
}

// One KEY=VALUE override written into the parsed file.
void apply_override(toml::table& root, const std::string& kv, const std::string& path) {
  const size_t eq = kv.find('=');
  const std::string key = kv.substr(0, eq),
                    value = eq == std::string::npos ? "" : kv.substr(eq + 1);
  auto fail = [&](const std::string& why) {
    return ConfigError(fmt::format("{}: --set {}: {}", path, kv, why));
  };
  if (eq == std::string::npos || value.empty())
    throw fail("expected KEY=VALUE, e.g. loss.tv_weight=0.5");
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t dot = key.find('.', b);
    parts.push_back(key.substr(b, dot - b));
    if (dot == std::string::npos) break;
    b = dot + 1;
  }
  for (const std::string& part : parts)
    if (part.empty())
      throw fail("expected a dotted key such as loss.jsd_beta, found \"" + key + "\"");
  toml::table* t = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = t->get(parts[i]);
    if (!n) n = &t->insert_or_assign(parts[i], toml::table{}).first->second;
    if (!n->is_table()) throw fail(parts[i] + " is " + describe(*n) + ", not a table");
    t = n->as_table();
  }
  toml::table parsed;  // a bare word (dpace, cuda:1) is a string
  try {
    const std::string doc = "v = " + value;
    parsed = toml::parse(std::string_view(doc), std::string_view("--set"));
  } catch (const toml::parse_error&) {
    parsed.insert("v", value);
  }
  t->insert_or_assign(parts.back(), std::move(*parsed.get("v")));
}

}  // namespace

Config load_config(const std::string& path) {
  return parse_config_toml(read_config_file(path), path);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (overrides.empty()) return load_config(path);
  toml::table root = parse_toml(read_config_file(path), path);
  std::string label = path + " with --set";
  for (const std::string& kv : overrides) {
    apply_override(root, kv, path);
    label += " " + kv;
  }
  Config c = from_table(root, label);
  c.path = path;
  return c;
}

namespace {

toml::array json_array_to_toml(const nlohmann::json& j, const std::string& label);

void insert_json(toml::table& t, const std::string& key, const nlohmann::json& v,
                 const std::string& label);

toml::table json_object_to_toml(const nlohmann::json& j, const std::string& label) {
  toml::table t;
  for (auto it = j.begin(); it != j.end(); ++it) insert_json(t, it.key(), it.value(), label);
  return t;
}

template <typename Sink>
void emit_json_value(Sink&& sink, const nlohmann::json& v, const std::string& what,
                     const std::string& label) {
  if (v.is_object())
    sink(json_object_to_toml(v, label));
  else if (v.is_array())
    sink(json_array_to_toml(v, label));
  else if (v.is_boolean())
    sink(v.get<bool>());
  else if (v.is_number_integer())
    sink(v.get<int64_t>());
  else if (v.is_number_float())
    sink(v.get<double>());
  else if (v.is_string())
    sink(v.get<std::string>());
  else
    throw ConfigError(fmt::format("{}: {}: expected a value, found null", label, what));
}

void insert_json(toml::table& t, const std::string& key, const nlohmann::json& v,
                 const std::string& label) {
  emit_json_value([&](auto&& x) { t.insert_or_assign(key, std::forward<decltype(x)>(x)); }, v, key,
                  label);
}

toml::array json_array_to_toml(const nlohmann::json& j, const std::string& label) {
  toml::array a;
  for (const auto& e : j)
    emit_json_value([&](auto&& x) { a.push_back(std::forward<decltype(x)>(x)); }, e,
                    "array element", label);
  return a;
}

}  // namespace

Config parse_config_json(const nlohmann::json& j, const std::string& label) {
  if (!j.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object, found {}", label, j.type_name()));
  return from_table(json_object_to_toml(j, label), label);
}

std::vector<int64_t> default_target_layer_ids(int64_t nt, int64_t nd) {
  if (nd == 1) return {nt / 2};
  const double start = 1.0, end = double(nt - 3), span = end - start;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < nd; ++i)
    ids.push_back(int64_t(std::nearbyint(start + double(i) * span / double(nd - 1))));
  return ids;
}

std::string tap_rule_violation(const std::vector<int64_t>& ids, int64_t nt, bool allow_last) {
  const std::string found = fmt::format("[{}]", fmt::join(ids, ", "));
  if (ids.empty()) return "expected at least one tapped layer, found an empty list";
  for (int64_t id : ids)
    if (id < 0 || id >= nt)
      return fmt::format(
          "expected layer ids in [0, {}) (target.num_hidden_layers = {}; the default rule "
          "spreads them over [1, Nt-3], so small targets need explicit ids), found {}",
          nt, nt, found);
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] <= ids[i - 1])
      return fmt::format(
          "expected distinct ids in ascending order (servers append the tapped states in "
          "layer order: any other order feeds fc its inputs scrambled), found {}",
          found);
  if (!allow_last && ids.back() == nt - 1)
    return fmt::format(
        "expected no tap of the target's last layer {} (SGLang cannot capture its state and "
        "speculators' converter drops it, so the drafter could not be served; set "
        "drafter.allow_last_layer_tap = true to train it anyway), found {}",
        nt - 1, found);
  return "";
}

}  // namespace dflash

#include "runtime/model/lora.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/json_parse.h"
#include "runtime/model/dtype.h"

namespace ltm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kModuleNames[kLoraModules] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                    "mlp.c_proj"};
// The Llama family's linear layers (PEFT's names), in the order of kLlamaSubOf's groups.
constexpr const char* kLlamaModuleNames[kLlamaLoraModules] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
// Prefixes PEFT writes before a Llama model's layer path (LlamaForCausalLM, LlamaModel).
constexpr const char* kLlamaPrefixes[] = {"base_model.model.model.", "base_model.model.", "model.",
                                          ""};
// Prefixes PEFT writes before the base model's module path (GPT2LMHeadModel, GPT2Model).
constexpr const char* kPrefixes[] = {"base_model.model.transformer.", "base_model.model.",
                                     "transformer.", ""};

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string& p) {  // follows links: a dangling one is missing
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Whether `p` lies strictly inside `root`, component by component (both canonical).
bool inside(const fs::path& root, const fs::path& p) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (r->empty()) continue;  // a trailing separator
    if (q == p.end() || *q != *r) return false;
  }
  return q != p.end();
}

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "a special file";
}

// Reads the whole file `path` of an adapter folder into memory, refusing whatever could read
// outside `root` (the folder that holds the adapter folder: --lora-dir for an adapter loaded by
// name) or stall the load. With links resolved the file must lie inside root; it is then opened
// one path component at a time from root with O_NOFOLLOW, so that a link put in place after the
// check is refused rather than followed, the last component with O_NONBLOCK (a FIFO cannot make
// the load wait for a writer), and it must be a regular file of at most max_bytes. Held in
// memory, not mapped: a file truncated on disk afterwards cannot raise SIGBUS in a serving rank.
absl::StatusOr<std::vector<uint8_t>> read_inside(const fs::path& root, const std::string& path,
                                                 uint64_t max_bytes, const std::string& limit) {
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  if (!inside(root, real))
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": resolves to ", real.string(), ", outside ", root.string(),
        " (an adapter's files must stay inside the folder that holds the adapter folder: "
        "--lora-dir for an adapter loaded by name)"));
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const fs::path rel = real.lexically_relative(root);
  for (auto it = rel.begin(); fd >= 0 && it != rel.end(); ++it) {
    const bool last = std::next(it) == rel.end();
    const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (last ? O_NONBLOCK : O_DIRECTORY);
    const int next = ::openat(fd, it->c_str(), flags);
    const int err = errno;
    ::close(fd);
    fd = next;
    errno = err;
  }
  if (fd < 0) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": cannot open ", real.string(), ": ", std::strerror(err),
        err == ELOOP || err == ENOTDIR ? " (a link appeared on its path while it was opened)" : ""));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", file_kind(st.st_mode), ": an adapter's files must be regular files"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, over the limit of ", max_bytes, " (", limit, ")"));
  }
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(path, ": out of memory reading ", size, " bytes"));
  }
  uint64_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, bytes.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": read ", got, " of ", size, " bytes: ",
                                              err ? std::strerror(err) : "the file was truncated"));
    }
    got += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return bytes;
}

absl::Status invalid(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// Input and output width of a module of the base model (`sub`: a Llama module, kLlamaModuleNames).
std::pair<int64_t, int64_t> module_shape(const ModelConfig& c, int sub) {
  const int64_t d = c.n_embd;
  if (c.is_llama()) {
    const std::pair<int64_t, int64_t> shapes[kLlamaLoraModules] = {
        {d, c.q_width()}, {d, c.kv_width()}, {d, c.kv_width()}, {c.q_width(), d},
        {d, c.n_inner},   {d, c.n_inner},    {c.n_inner, d}};
    return shapes[sub];
  }
  switch (static_cast<LoraModule>(sub)) {
    case LoraModule::kAttnQkv: return {d, 3 * d};
    case LoraModule::kAttnProj: return {d, d};
    case LoraModule::kMlpFc: return {d, c.n_inner};
    case LoraModule::kMlpProj: return {c.n_inner, d};
  }
  return {0, 0};
}

// Whether a target_modules entry names `m`: PEFT matches entries as suffixes of the module path
// ("c_proj" names both attn.c_proj and mlp.c_proj; "attn.c_attn" and "h.0.attn.c_attn" one).
bool target_names(const std::string& target, const std::string& full) {
  if (target == full) return true;
  if (full.size() > target.size() && full.ends_with(target) &&
      full[full.size() - target.size() - 1] == '.')
    return true;
  // An entry with a layer path in front ("h.3.attn.c_attn") names the module too.
  return target.size() > full.size() && target.ends_with(full) &&
         target[target.size() - full.size() - 1] == '.';
}

// "h.<layer>.<module>.lora_<A|B>.weight" (after a PEFT prefix) -> parts; false otherwise.
// "[model.]layers.<layer>.<module>..." for the Llama family.
bool parse_tensor_name(std::string_view name, bool llama, int64_t* layer, std::string* module,
                       char* which) {
  const std::string_view layers = llama ? "layers." : "h.";
  const char* const* first = llama ? std::begin(kLlamaPrefixes) : std::begin(kPrefixes);
  const char* const* last = llama ? std::end(kLlamaPrefixes) : std::end(kPrefixes);
  for (const char* const* it = first; it != last; ++it) {
    const char* prefix = *it;
    std::string_view rest = name;
    const std::string_view p = prefix;
    if (rest.substr(0, p.size()) != p) continue;
    rest.remove_prefix(p.size());
    if (rest.substr(0, layers.size()) != layers) continue;
    rest.remove_prefix(layers.size());
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string_view::npos || dot > 9) continue;
    int64_t l = 0;
    bool digits = true;
    for (char c : rest.substr(0, dot)) {
      if (c < '0' || c > '9') digits = false;
      l = l * 10 + (c - '0');
    }
    if (!digits) continue;
    rest.remove_prefix(dot + 1);
    for (std::string_view tail : {".lora_A.weight", ".lora_B.weight", ".lora_A.default.weight",
                                  ".lora_B.default.weight"}) {
      if (rest.size() > tail.size() && rest.ends_with(tail)) {
        *layer = l;
        *module = std::string(rest.substr(0, rest.size() - tail.size()));
        *which = tail[6];
        return true;
      }
    }
  }
  return false;
}

}  // namespace

const char* lora_module_name(LoraModule m) { return kModuleNames[static_cast<int>(m)]; }

absl::StatusOr<LoraAdapter> LoraAdapter::open(const std::string& dir_arg, const ModelConfig& config,
                                              int max_rank) {
  std::string dir = dir_arg;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!is_dir(dir))
    return absl::NotFoundError(absl::StrCat(dir, ": LoRA adapter folder not found (expected a PEFT "
                                            "folder with ", kLoraConfigFile, " and ",
                                            kLoraWeightsFile, ")"));
  const std::string config_path = absl::StrCat(dir, "/", kLoraConfigFile);
  const std::string weights_path = absl::StrCat(dir, "/", kLoraWeightsFile);
  if (!exists(config_path))
    return absl::NotFoundError(absl::StrCat(config_path, ": missing (a PEFT adapter folder has ",
                                            kLoraConfigFile, " beside ", kLoraWeightsFile, ")"));
  if (!exists(weights_path)) {
    const bool bin = exists(absl::StrCat(dir, "/adapter_model.bin"));
    return absl::NotFoundError(absl::StrCat(
        weights_path, ": missing",
        bin ? " (the folder has adapter_model.bin: save it with safe_serialization=True)" : ""));
  }
  // The adapter's files must stay inside the folder that holds it (read_inside above).
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec).parent_path();
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  LTM_ASSIGN_OR_RETURN(const std::vector<uint8_t> config_bytes,
                       read_inside(root, config_path, kMaxLoraConfigBytes,
                                   "a PEFT adapter_config.json is a few hundred bytes"));
  const std::string config_text(config_bytes.begin(), config_bytes.end());

  // --- adapter_config.json -----------------------------------------------------------------------
  json cfg;
  {
    std::istringstream in(config_text);
    std::ostringstream text;
    text << in.rdbuf();
    absl::StatusOr<json> parsed = parse_json(text.str());
    if (!parsed.ok())
      return invalid(config_path, absl::StrCat("invalid JSON: ", parsed.status().message()));
    cfg = std::move(*parsed);
  }
  if (!cfg.is_object()) return invalid(config_path, "expected a JSON object");
  if (cfg.contains("peft_type") && cfg["peft_type"] != "LORA")
    return invalid(config_path, absl::StrCat("peft_type is ", json_brief(cfg["peft_type"]),
                                             "; ltm serves only LORA adapters"));
  if (!cfg.contains("r") || !cfg["r"].is_number_integer())
    return invalid(config_path, "\"r\" (the rank) is missing or not an integer");
  const int64_t r = cfg["r"].get<int64_t>();
  if (r < 1) return invalid(config_path, absl::StrCat("r = ", r, " must be >= 1"));
  if (r > max_rank || r > kMaxLoraRank)
    return invalid(config_path, absl::StrCat("rank r = ", r, " is over the maximum of ",
                                             std::min(max_rank, kMaxLoraRank), " (--lora-max-rank)"));
  double alpha = static_cast<double>(r);  // PEFT's default lora_alpha is 8 = its default r; keep s = 1
  if (cfg.contains("lora_alpha")) {
    if (!cfg["lora_alpha"].is_number())
      return invalid(config_path, "\"lora_alpha\" must be a number");
    alpha = cfg["lora_alpha"].get<double>();
    if (!std::isfinite(alpha) || alpha <= 0)
      return invalid(config_path, absl::StrCat("lora_alpha = ", alpha, " must be a finite number > 0"));
  }
  if (cfg.contains("fan_in_fan_out") && !cfg["fan_in_fan_out"].is_boolean())
    return invalid(config_path, "\"fan_in_fan_out\" must be true or false");
  bool rslora = false;
  if (cfg.contains("use_rslora")) {
    if (!cfg["use_rslora"].is_boolean()) return invalid(config_path, "\"use_rslora\" must be a boolean");
    rslora = cfg["use_rslora"].get<bool>();
  }
  // Options that change the computation in ways ltm does not implement.
  auto set = [&](const char* key) {
    if (!cfg.contains(key)) return false;
    const json& v = cfg[key];
    return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
             (v.is_array() && v.empty()) || (v.is_string() && (v == "none" || v.get<std::string>().empty())));
  };
  for (const char* key : {"use_dora", "rank_pattern", "alpha_pattern", "modules_to_save",
                          "layers_to_transform", "bias"}) {
    if (set(key))
      return invalid(config_path, absl::StrCat("\"", key, "\" is ", json_brief(cfg[key]),
                                               "; ltm serves plain LoRA (no DoRA, per-module "
                                               "ranks, saved modules, layer subsets or biases)"));
  }
  if (!cfg.contains("target_modules"))
    return invalid(config_path, "\"target_modules\" is missing");
  std::vector<std::string> targets;
  if (cfg["target_modules"].is_string()) {
    targets.push_back(cfg["target_modules"].get<std::string>());
  } else if (cfg["target_modules"].is_array()) {
    for (const json& t : cfg["target_modules"]) {
      if (!t.is_string()) return invalid(config_path, "\"target_modules\" must hold strings");
      targets.push_back(t.get<std::string>());
    }
  } else {
    return invalid(config_path, "\"target_modules\" must be a list of module names");
  }
  if (targets.empty()) return invalid(config_path, "\"target_modules\" is empty");
  const bool llama = config.is_llama();
  const int n_sub = llama ? kLlamaLoraModules : kLoraModules;
  const char* const* names = llama ? kLlamaModuleNames : kModuleNames;
  const std::string family_modules =
      llama ? absl::StrCat(config.architecture, " has ", absl::StrJoin(kLlamaModuleNames, ", "))
            : "GPT-2 has attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj";
  for (const std::string& t : targets) {
    bool known = false;
    for (int m = 0; m < n_sub; ++m) known = known || target_names(t, names[m]);
    if (!known)
      return invalid(config_path,
                     absl::StrCat("target module \"", t, "\" is not a module of the base model (",
                                  family_modules, ")"));
  }

  const double scale = rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / r;
  if (scale > kMaxLoraScale)
    return invalid(config_path,
                   absl::StrCat("lora_alpha / ", rslora ? "sqrt(r)" : "r", " = ", scale,
                                " (lora_alpha = ", alpha, ", r = ", r, ") is over ltm's limit of ",
                                kMaxLoraScale, " for the scale of an update"));

  LoraAdapter a;
  a.dir_ = dir;
  a.rank_ = static_cast<int>(r);
  a.alpha_ = static_cast<float>(alpha);
  a.scale_ = static_cast<float>(scale);
  a.n_layer_ = config.n_layer;
  a.llama_ = llama;
  a.tensors_.assign(static_cast<size_t>(config.n_layer) * n_sub, Pair{});

  // --- adapter_model.safetensors -------------------------------------------------------------------
  // No valid adapter of rank r for this base model is larger than every module of every layer in
  // F32, plus room for the header: a larger file is refused before it is read.
  uint64_t max_data = 0;
  for (int m = 0; m < n_sub; ++m) {
    const auto [in, out] = module_shape(config, m);
    max_data += static_cast<uint64_t>(r) * static_cast<uint64_t>(in + out) * sizeof(float);
  }
  max_data *= static_cast<uint64_t>(config.n_layer);
  LTM_ASSIGN_OR_RETURN(
      std::vector<uint8_t> weight_bytes,
      read_inside(root, weights_path, max_data + kLoraHeaderSlackBytes,
                  absl::StrCat("every module of every layer at rank ", r, " in F32, plus ",
                               kLoraHeaderSlackBytes >> 20, " MiB for the header")));
  LTM_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::parse(MappedFile::from_bytes(
                                                 weights_path, std::move(weight_bytes))));
  a.file_ = std::make_unique<SafetensorsFile>(std::move(file));
  for (const SafetensorsTensor& t : a.file_->tensors()) {
    const std::string where = absl::StrCat(weights_path, ": tensor \"", t.name, "\"");
    int64_t layer = 0;
    std::string module;
    char which = 0;
    if (!parse_tensor_name(t.name, llama, &layer, &module, &which))
      return invalid(where, llama ? "is not a LoRA weight of a Llama-family module (expected "
                                    "base_model.model.model.layers.<i>.<module>.lora_A.weight / "
                                    "lora_B.weight)"
                                  : "is not a LoRA weight of a GPT-2 module (expected "
                                    "base_model.model.transformer.h.<i>.<module>.lora_A.weight / "
                                    "lora_B.weight)");
    int m = 0;
    while (m < n_sub && module != names[m]) ++m;
    if (m == n_sub)
      return invalid(where, absl::StrCat("names module \"", module, "\", which the base model does "
                                         "not have (", family_modules, ")"));
    if (layer >= config.n_layer)
      return invalid(where, absl::StrCat("names layer ", layer, ", which the base model does not "
                                         "have (n_layer = ", config.n_layer, ")"));
    bool targeted = false;
    for (const std::string& tgt : targets) targeted = targeted || target_names(tgt, names[m]);
    if (!targeted)
      return invalid(where, absl::StrCat("is for module ", module, ", which target_modules (",
                                         absl::StrJoin(targets, ", "), ") does not name"));
    if (!t.dtype)
      return invalid(where, absl::StrCat("has dtype ", t.dtype_name, "; ltm reads F32, F16 and BF16"));
    const auto [in, out] = module_shape(config, m);
    const std::vector<int64_t> want =
        which == 'A' ? std::vector<int64_t>{r, in} : std::vector<int64_t>{out, r};
    if (t.shape != want)
      return invalid(where, absl::StrCat("has shape ", shape_string(t.shape), ", expected ",
                                         shape_string(want), which == 'A' ? " = [r, in]" : " = [out, r]",
                                         " for ", module, " (r = ", r, ", n_embd = ", config.n_embd,
                                         ", n_inner = ", config.n_inner, ")"));
    Pair& p = a.tensors_[a.sub_index(layer, m)];
    const SafetensorsTensor*& slot = which == 'A' ? p.a : p.b;
    if (slot != nullptr) return invalid(where, "appears twice (with and without \".default\"?)");
    slot = &t;
  }
  bool any = false;
  for (int64_t l = 0; l < config.n_layer; ++l) {
    for (int m = 0; m < n_sub; ++m) {
      const Pair& p = a.tensors_[a.sub_index(l, m)];
      if ((p.a == nullptr) != (p.b == nullptr))
        return invalid(weights_path,
                       absl::StrCat(llama ? "layers." : "h.", l, ".", names[m], " has lora_",
                                    p.a ? "A" : "B", " but no lora_", p.a ? "B" : "A"));
      any = any || p.a != nullptr;
    }
  }
  if (!any) return invalid(weights_path, "holds no LoRA weights");

  // Every value is finite, and so is every value of B times the scale (what the ranks hold). All
  // of them, on every rank, not only a rank's own slices: rank 0 then refuses an adapter that any
  // rank would hold a bad value of before it asks the others to load it.
  std::vector<float> buf(4096);
  for (const SafetensorsTensor& t : a.file_->tensors()) {
    const bool is_b = t.name.find(".lora_B.") != std::string::npos;
    const uint8_t* data = a.file_->tensor_data(t);
    const int64_t es = dtype_size(*t.dtype);
    for (int64_t i0 = 0; i0 < t.numel; i0 += static_cast<int64_t>(buf.size())) {
      const int64_t n = std::min<int64_t>(t.numel - i0, static_cast<int64_t>(buf.size()));
      convert_to_f32(*t.dtype, data + i0 * es, n, buf.data());
      for (int64_t i = 0; i < n; ++i) {
        const float v = buf[i];
        if (std::isfinite(v) && (!is_b || std::isfinite(v * a.scale_))) continue;
        const int64_t e = i0 + i, cols = t.shape[1];
        return invalid(absl::StrCat(weights_path, ": tensor \"", t.name, "\""),
                       absl::StrCat("element ", e, " [", e / cols, ", ", e % cols, "] is ", v,
                                    std::isfinite(v) ? absl::StrCat(", which times the scale ",
                                                                    a.scale_, " overflows float")
                                                     : "",
                                    ": LoRA values must be finite"));
      }
    }
  }
  return a;
}

std::vector<std::string> LoraAdapter::modules() const {
  std::vector<std::string> out;
  for (int m = 0; m < n_parts(); ++m) {
    bool used = false;
    for (int64_t l = 0; l < n_layer_; ++l) used = used || has_part(l, m);
    if (used) out.push_back(llama_ ? kLlamaModuleNames[m] : kModuleNames[m]);
  }
  return out;
}

std::vector<int> LoraAdapter::parts(LoraModule m) const {
  if (!llama_) return {static_cast<int>(m)};
  switch (m) {
    case LoraModule::kAttnQkv: return {0, 1, 2};
    case LoraModule::kAttnProj: return {3};
    case LoraModule::kMlpFc: return {4, 5};
    case LoraModule::kMlpProj: return {6};
  }
  return {};
}

void LoraAdapter::read_a(int64_t layer, LoraModule m, const std::vector<parallel::Range>& in,
                         float* out) const {
  LTM_ASSERT(!llama_, "read_a of a fused Llama module: read_lora_slice reads its parts");
  read_a_part(layer, static_cast<int>(m), in, out);
}

void LoraAdapter::read_b_scaled(int64_t layer, LoraModule m,
                                const std::vector<parallel::Range>& out_rows, float* out) const {
  LTM_ASSERT(!llama_, "read_b_scaled of a fused Llama module: read_lora_slice reads its parts");
  read_b_scaled_part(layer, static_cast<int>(m), out_rows, out);
}

void LoraAdapter::read_a_part(int64_t layer, int sub, const std::vector<parallel::Range>& in,
                              float* out) const {
  const SafetensorsTensor& t = *tensors_[sub_index(layer, sub)].a;
  const int64_t cols = t.shape[1];
  int64_t width = 0;
  for (const parallel::Range& r : in) width += r.size();
  const uint8_t* data = file_->tensor_data(t);
  const int64_t es = dtype_size(*t.dtype);
  for (int64_t row = 0; row < rank_; ++row) {
    int64_t col0 = 0;
    for (const parallel::Range& r : in) {
      LTM_ASSERT(0 <= r.begin && r.end <= cols);
      convert_to_f32(*t.dtype, data + (row * cols + r.begin) * es, r.size(),
                     out + row * width + col0);
      col0 += r.size();
    }
  }
}

void LoraAdapter::read_b_scaled_part(int64_t layer, int sub,
                                     const std::vector<parallel::Range>& out_rows,
                                     float* out) const {
  const SafetensorsTensor& t = *tensors_[sub_index(layer, sub)].b;
  const uint8_t* data = file_->tensor_data(t);
  const int64_t es = dtype_size(*t.dtype);
  int64_t row0 = 0;
  for (const parallel::Range& r : out_rows) {
    LTM_ASSERT(0 <= r.begin && r.end <= t.shape[0]);
    convert_to_f32(*t.dtype, data + r.begin * rank_ * es, r.size() * rank_, out + row0 * rank_);
    row0 += r.size();
  }
  for (int64_t i = 0; i < row0 * rank_; ++i) out[i] *= scale_;
}

LoraShardRanges lora_shard_ranges(const ModelConfig& c, parallel::Range heads, parallel::Range ffn,
                                  parallel::Range kv_heads) {
  const int64_t d = c.n_embd, hd = c.head_dim();
  if (c.is_llama()) {  // per part, in the part's own rows (model_llama.cpp's slices)
    const parallel::Range q{heads.begin * hd, heads.end * hd};
    const parallel::Range kv{kv_heads.begin * hd, kv_heads.end * hd};
    LoraShardRanges s;
    s.in[0] = {{0, d}};
    s.out[0] = {q, kv, kv};        // q_proj, k_proj, v_proj: column-parallel
    s.in[1] = {q};                 // o_proj: row-parallel
    s.out[1] = {{0, d}};
    s.in[2] = {{0, d}};
    s.out[2] = {ffn, ffn};         // gate_proj, up_proj
    s.in[3] = {ffn};               // down_proj
    s.out[3] = {{0, d}};
    return s;
  }
  const parallel::Range cols{heads.begin * hd, heads.end * hd};  // this rank's attention columns
  const parallel::Range all_d{0, d}, all_ff{0, c.n_inner};
  LoraShardRanges s;
  // c_attn: column-parallel over the fused Q | K | V output, per head group.
  s.in[0] = {all_d};
  s.out[0] = {{cols.begin, cols.end}, {d + cols.begin, d + cols.end}, {2 * d + cols.begin, 2 * d + cols.end}};
  // attention c_proj: row-parallel, the rows of this rank's heads.
  s.in[1] = {cols};
  s.out[1] = {all_d};
  // c_fc: column-parallel; mlp c_proj: row-parallel.
  s.in[2] = {all_d};
  s.out[2] = {ffn};
  s.in[3] = {ffn};
  s.out[3] = {all_d};
  (void)all_ff;
  return s;
}

LoraSlice read_lora_slice(const LoraAdapter& adapter, const LoraShardRanges& ranges, int64_t layer,
                          LoraModule m) {
  LoraSlice s;
  if (!adapter.has(layer, m)) return s;
  const int i = static_cast<int>(m);
  const std::vector<int> parts = adapter.parts(m);
  if (parts.size() > 1 || adapter.parts(m)[0] != i) {
    // A fused Llama module of n parts: rank n r, A = the parts' A stacked [n r, in], B = their
    // B block-diagonal [sum of outs, n r] (a part without an update keeps zero blocks).
    const int64_t r = adapter.rank(), n = static_cast<int64_t>(parts.size());
    LTM_ASSERT(ranges.out[i].size() == parts.size());
    s.rank = static_cast<int>(n * r);
    for (const parallel::Range& x : ranges.in[i]) s.in += x.size();
    for (const parallel::Range& x : ranges.out[i]) s.out += x.size();
    s.a.assign(static_cast<size_t>(s.rank * s.in), 0.0f);
    s.b.assign(static_cast<size_t>(s.out * s.rank), 0.0f);
    std::vector<float> b;
    int64_t row0 = 0;
    for (int64_t k = 0; k < n; ++k) {
      const parallel::Range out = ranges.out[i][k];
      if (adapter.has_part(layer, parts[k])) {
        adapter.read_a_part(layer, parts[k], ranges.in[i], s.a.data() + k * r * s.in);
        b.resize(static_cast<size_t>(out.size() * r));
        adapter.read_b_scaled_part(layer, parts[k], {out}, b.data());
        for (int64_t row = 0; row < out.size(); ++row)
          std::copy_n(b.data() + row * r, r, s.b.data() + (row0 + row) * s.rank + k * r);
      }
      row0 += out.size();
    }
    return s;
  }
  s.rank = adapter.rank();
  for (const parallel::Range& r : ranges.in[i]) s.in += r.size();
  for (const parallel::Range& r : ranges.out[i]) s.out += r.size();
  s.a.resize(static_cast<size_t>(s.rank * s.in));
  s.b.resize(static_cast<size_t>(s.out * s.rank));
  adapter.read_a(layer, m, ranges.in[i], s.a.data());
  adapter.read_b_scaled(layer, m, ranges.out[i], s.b.data());
  return s;
}

absl::Status merge_lora_rows(const LoraSlice& s, float* w, int64_t row_begin, int64_t row_end) {
  if (s.empty()) return absl::OkStatus();
  const int64_t r = s.rank, n = s.out;
  // LoraAdapter::open refuses larger ranks; a fused Llama module has up to 3 parts.
  LTM_ASSERT(r <= 3 * kMaxLoraRank);
  // W[i, j] += sum_k A[k, i] B[j, k]; accumulated in double, rounded once into the fp32 weight.
  // A finite weight that the update takes out of float's range is remembered (the first in
  // row-major order), not folded in silently.
  std::atomic<int64_t> first_bad{INT64_MAX};
#pragma omp parallel for schedule(static) if ((row_end - row_begin) * n * r > (1 << 18))
  for (int64_t i = row_begin; i < row_end; ++i) {
    double a_col[3 * kMaxLoraRank];
    for (int64_t k = 0; k < r; ++k) a_col[k] = s.a[k * s.in + i];
    float* row = w + (i - row_begin) * n;
    for (int64_t j = 0; j < n; ++j) {
      const float* b = s.b.data() + j * r;
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += a_col[k] * b[k];
      const float merged = static_cast<float>(row[j] + acc);
      if (!std::isfinite(merged) && std::isfinite(row[j])) [[unlikely]] {
        int64_t seen = first_bad.load();
        while (i * n + j < seen && !first_bad.compare_exchange_weak(seen, i * n + j)) {
        }
      }
      row[j] = merged;
    }
  }
  if (const int64_t e = first_bad.load(); e != INT64_MAX)
    return absl::InvalidArgumentError(absl::StrCat(
        "merging the LoRA update makes element [", e / n, ", ", e % n,
        "] of the weight non-finite (the update overflows float)"));
  return absl::OkStatus();
}

}  // namespace ltm

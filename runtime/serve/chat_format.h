// A model's chat format: how a list of messages becomes a prompt, and which tokens end a reply.
//
// The prompt is the model's Jinja `chat_template` (tokenizer_config.json in the tokenizer folder,
// or chat_template.jinja beside it, or --chat-template FILE), rendered as HF transformers'
// apply_chat_template does: context {messages, add_generation_prompt: true, bos_token,
// eos_token, unk_token, pad_token}, then tokenized with no special tokens added (the template
// writes bos itself when the model wants it, so it is never doubled), where the special tokens
// (bos/eos and tokenizer_config.json's added_tokens_decoder) that occur in the rendered text are
// matched whole, longest first, before the BPE runs on the text between them (as transformers'
// added-token split does).
//
// A reply ends (finish_reason "stop", the token's text never sent) at the checkpoint's
// eos_token_id (the scheduler knows it), at generation_config.json's eos_token_id (an int or a
// list), at tokenizer_config.json's eos_token, and at the template's end-of-turn token (one of
// <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>, <end_of_turn>, <|END_OF_TURN_TOKEN|> that the
// template's source names), each when it is one token of the vocabulary.
//
// The template is parsed once, at load; a template that does not parse, or a config file that is
// not what it should be, is a load error naming the file. Immutable after load: shared read-only
// by the HTTP and gRPC threads.
#pragma once

#include <nlohmann/json.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/text/tokenizer.h"

namespace ltm {

// What a model folder says about chatting with the model.
struct ChatFormatSpec {
  std::string template_source;  // empty: the model has no chat template
  std::string template_origin;  // the file it came from (for messages)
  std::string bos_token, eos_token, unk_token, pad_token;  // as text; empty: none
  // Texts matched as one token before BPE, with their ids (bos/eos/added tokens).
  std::vector<std::pair<std::string, int32_t>> special_tokens;
  std::vector<int32_t> generation_eos_ids;  // generation_config.json's eos_token_id
};

class ChatFormat {
 public:
  // Renders the template for one context ({messages, add_generation_prompt, bos_token, ...}).
  using Renderer = std::function<absl::StatusOr<std::string>(const nlohmann::json& context)>;

  // Reads `tokenizer_dir`/tokenizer_config.json (and chat_template.jinja) and
  // `model_dir`/generation_config.json, each optional; `template_file` (non-empty) replaces the
  // folder's template. Errors name the file: unreadable, not JSON, a field of the wrong type, an
  // id outside [0, vocab_size), a template that does not parse.
  static absl::StatusOr<std::shared_ptr<const ChatFormat>> load(const std::string& tokenizer_dir,
                                                                const std::string& model_dir,
                                                                const std::string& template_file,
                                                                const Tokenizer& tokenizer,
                                                                int64_t vocab_size);
  // From a spec already read. `renderer` null: spec.template_source is parsed (Jinja). The
  // tokenizer must outlive the format.
  static absl::StatusOr<std::shared_ptr<const ChatFormat>> create(ChatFormatSpec spec,
                                                                  Renderer renderer,
                                                                  const Tokenizer& tokenizer,
                                                                  int64_t vocab_size);

  bool has_template() const { return static_cast<bool>(renderer_); }
  const std::string& template_origin() const { return spec_.template_origin; }

  // The prompt text of `messages` (a list of {role, content[, name]} objects, validated by the
  // caller). InvalidArgument with the template's own message when it raises an exception or
  // fails. Requires has_template().
  absl::StatusOr<std::string> render(const nlohmann::json& messages) const;
  // Token ids of rendered text: special tokens matched whole, BPE between them.
  std::vector<int32_t> encode(std::string_view text) const;
  // The ids that end a chat reply (besides the checkpoint's eos_token_id), and those that end any
  // generation (generation_config.json's).
  const std::vector<int32_t>& chat_end_ids() const { return chat_end_ids_; }
  const std::vector<int32_t>& generation_eos_ids() const { return spec_.generation_eos_ids; }

 private:
  ChatFormat(ChatFormatSpec spec, Renderer renderer, const Tokenizer& tokenizer);
  ChatFormatSpec spec_;
  Renderer renderer_;
  const Tokenizer* tokenizer_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  bool first_byte_[256] = {};                              // some special starts with it
  std::vector<int32_t> chat_end_ids_;
};

}  // namespace ltm

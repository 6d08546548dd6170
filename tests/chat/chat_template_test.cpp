// Tests of runtime/chat: the chat template interpreter's errors, limits and the Python semantics
// that the differential test (tests/python/test_chat_template_reference.py, against jinja2 and
// @huggingface/jinja) does not reach: syntax errors with line and column, raise_exception's
// status, undefined values, bounded renders, float and repr formatting, key order, threads.
#include "runtime/chat/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"

namespace ltm {
namespace {

using nlohmann::ordered_json;

std::string render_ok(const std::string& src, const ordered_json& ctx = ordered_json::object()) {
  absl::StatusOr<std::string> r = render_chat_template(src, ctx);
  EXPECT_TRUE(r.ok()) << src << " -> " << r.status();
  return r.ok() ? *r : "";
}

absl::Status render_error(const std::string& src, const ordered_json& ctx = ordered_json::object(),
                          const ChatTemplateLimits& limits = {}) {
  absl::StatusOr<std::string> r = render_chat_template(src, ctx, limits);
  EXPECT_FALSE(r.ok()) << src << " rendered " << (r.ok() ? *r : "");
  return r.ok() ? absl::OkStatus() : r.status();
}

TEST(ChatTemplateParse, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    const char* src;
    const char* message;
  };
  const Case cases[] = {
      {"hello {{ x ", "line 1, column 7: '{{' not closed (no }})"},
      {"a\nb {% if x %}c", "missing {% endif %}"},
      {"{% for x in y %}{% endif %}",
       "line 1, column 20: unknown or unsupported statement 'endif'"},
      {"a\n\n  {{ 1 + }}", "line 3, column 10: expected an expression, found '}}'"},
      {"{% include 'x' %}", "unsupported statement 'include'"},
      {"{% if x %}{% else %}{% elif y %}{% endif %}", "unknown or unsupported statement 'elif'"},
      {"{{ 'abc }}", "line 1, column 4: string literal not closed"},
      {"{# never closed", "comment not closed"},
      {"{{ x | }}", "expected a filter name"},
      {"{% break %}", "'break' outside a loop"},
      {"{{ f(a=1, 2) }}", "positional argument after a keyword argument"},
      {"{{ 99999999999999999999 }}", "integer literal too large"},
      {"{{ x ] }}", "unexpected ']'"},
      {"{{ x @ y }}", "unexpected character '@'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::parse(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(t.status().message()).find(c.message), std::string::npos)
        << c.src << " -> " << t.status().message();
    EXPECT_EQ(std::string(t.status().message()).rfind("chat template: ", 0), 0u);
  }
}

TEST(ChatTemplateParse, DeepNestingIsAnErrorNotACrash) {
  EXPECT_FALSE(
      ChatTemplate::parse("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}")
          .ok());
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if x %}";
  EXPECT_FALSE(ChatTemplate::parse(ifs).ok());
  std::string nots = "{{ ";
  for (int i = 0; i < 10000; ++i) nots += "not ";
  EXPECT_FALSE(ChatTemplate::parse(nots + "x }}").ok());
  std::string negs = "{{ ";
  for (int i = 0; i < 10000; ++i) negs += "-";
  EXPECT_FALSE(ChatTemplate::parse(negs + "1 }}").ok());
}

TEST(ChatTemplateRender, RaiseExceptionIsAClearInvalidArgument) {
  const absl::Status s = render_error(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user, got ' ~ "
      "messages[0].role) }}{% endif %}",
      {{"messages", {{{"role", "system"}, {"content", "x"}}}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "chat template raised: first must be user, got system");
}

TEST(ChatTemplateRender, ErrorMessagesAreShortValidUtf8) {
  const absl::Status s = render_error("{{ raise_exception('\xff' ~ 'x' * 1000) }}");
  EXPECT_EQ(s.message().substr(0, 24), "chat template raised: ?x");
  EXPECT_LE(s.message().size(), 404u);
  EXPECT_EQ(s.message().substr(s.message().size() - 4), "x...");
  const absl::StatusOr<ChatTemplate> t =
      ChatTemplate::parse("{% " + std::string(5000, 'k') + " %}");
  ASSERT_FALSE(t.ok());
  EXPECT_LE(t.status().message().size(), 404u);
}

TEST(ChatTemplateRender, UndefinedPrintsNothingButItsAttributesFail) {
  EXPECT_EQ(render_ok("[{{ nothing }}]{% if nothing %}x{% endif %}{{ nothing | length }}"), "[]0");
  EXPECT_EQ(render_ok("{% for x in nothing %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render_ok("{{ d.missing is defined }}", {{"d", ordered_json::object()}}), "False");
  const absl::Status s = render_error("line one\n{{ nothing.attr }}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "chat template: line 2: 'nothing' is undefined");
  EXPECT_EQ(render_error("{{ d.a.b }}", {{"d", ordered_json::object()}}).message(),
            "chat template: line 1: 'dict object' has no attribute 'a'");
  EXPECT_EQ(render_error("{{ 'a' + 1 }}").message(),
            "chat template: line 1: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(render_error("{{ x | nosuchfilter }}").message(),
            "chat template: line 1: no filter named 'nosuchfilter'");
}

TEST(ChatTemplateRender, PythonFormatting) {
  EXPECT_EQ(
      render_ok("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 123456.789 }} {{ 7 / 2 }}"),
      "1.0 0.30000000000000004 1e+16 1.5e-07 123456.789 3.5");
  EXPECT_EQ(render_ok("{{ 1e15 }} {{ 0.0001 }} {{ -2.5 }} {{ 10 / 5 }}"),
            "1000000000000000.0 0.0001 -2.5 2.0");
  EXPECT_EQ(render_ok("{{ [1, 'a', none, true, 2.0, {'k': \"it's\"}] }}"),
            "[1, 'a', None, True, 2.0, {'k': \"it's\"}]");
  EXPECT_EQ(render_ok("{{ x }}", {{"x", {{"b", 1}, {"a", "\n"}}}}), "{'b': 1, 'a': '\\n'}");
}

TEST(ChatTemplateRender, TojsonKeepsKeyOrderAndUnicode) {
  const ordered_json ctx = {{"tool", {{"name", "f"}, {"arguments", {{"z", 1}, {"a", "é\"\n"}}}}}};
  EXPECT_EQ(render_ok("{{ tool | tojson }}", ctx),
            "{\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": \"é\\\"\\n\"}}");
  EXPECT_EQ(render_ok("{{ [1, [2, {}]] | tojson(indent=2) }}"),
            "[\n  1,\n  [\n    2,\n    {}\n  ]\n]");
  EXPECT_EQ(render_ok("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_FALSE(render_chat_template("{{ nothing | tojson }}", ordered_json::object()).ok());
}

TEST(ChatTemplateRender, WhitespaceControlAsTransformers) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render_ok("{% for i in [1, 2] %}\n    {{ i }}\n{% endfor %}\n"), "    1\n    2\n");
  EXPECT_EQ(render_ok("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render_ok("  {%+ if true %}x{% endif +%}\ny\n"), "  x\ny");
  EXPECT_EQ(render_ok("{# c #}\n  {# d #}\nz"), "z");
  EXPECT_EQ(render_ok("a\r\nb\r\n"), "a\nb");
}

TEST(ChatTemplateRender, ScopesNamespacesAndMacros) {
  EXPECT_EQ(
      render_ok(
          "{% set a = 1 %}{% for i in [1, 2] %}{% set a = a + i %}{{ a }}{% endfor %}{{ a }}"),
      "241");
  EXPECT_EQ(render_ok("{% set ns = namespace(a=1) %}{% for i in [1, 2] %}{% set ns.a = ns.a + i %}"
                      "{% endfor %}{{ ns.a }}"),
            "4");
  EXPECT_EQ(
      render_ok("{% macro m(x, y='d') %}<{{ x }}{{ y }}{{ top }}>{% endmacro %}{% set top = 't' %}"
                "{{ m(1) }}{{ m(2, y='e') }}"),
      "<1dt><2et>");
  EXPECT_EQ(render_error("{% set s = 1 %}{% set s.a = 2 %}").message(),
            "chat template: line 1: cannot set attribute 'a' of int 's' (only of a namespace())");
}

TEST(ChatTemplateRender, LimitsStopRunawayTemplates) {
  ChatTemplateLimits small;
  small.max_steps = 10000;
  small.max_output_bytes = 1000;
  small.max_alloc_bytes = 1000000;
  // Loops that would run for hours.
  absl::Status s = render_error(
      "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", {},
      small);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // Output past the limit.
  s = render_error("{% for i in range(50) %}{% for j in range(50) %}x{% endfor %}{% endfor %}", {},
                   small);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(std::string(s.message()).find("output"), std::string::npos) << s;
  // A string doubling itself, a big repetition, a huge range: memory, not output.
  for (const char* src : {
           "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
           "{% endfor %}",
           "{{ ('x' * 1000000000) | length }}",
           "{{ range(100000000) | length }}",
           "{% set l = [1, 2, 3, 4] %}{{ (l * 1000000000000) | length }}",
       }) {
    s = render_error(src, {}, small);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << src << " -> " << s;
  }
  // Unbounded macro recursion.
  s = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(std::string(s.message()).find("macro calls nest deeper"), std::string::npos) << s;
  // Integer overflow is an error, not undefined behaviour.
  EXPECT_EQ(render_error("{{ 9223372036854775807 + 1 }}").message(),
            "chat template: line 1: integer overflow");
  EXPECT_EQ(render_error("{{ 2 ** 64 }}").message(), "chat template: line 1: integer overflow");
  // Deeply nested context JSON.
  ordered_json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = ordered_json::array({deep});
  s = render_error("{{ x }}", {{"x", deep}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

// Values that refer to themselves or share their parts: fuzz findings (a namespace holding a
// tuple that holds it took the renderer's stack in repr). Each is a clean limit error; default
// limits, as a server renders with.
TEST(ChatTemplateRender, SelfReferenceDeepNestingAndSharedPartsAreBounded) {
  const std::string ns = "{% set ns = namespace(a=1, x=[]) %}";
  // A namespace in itself, printed (directly, through a tuple, twice a level).
  for (const std::string src : {ns + "{% set ns.a = ns %}{{ ns }}",
                                ns + "{% set ns.a = ns, 1 %}{{ ns }}",
                                ns + "{% set ns.a = ns %}{% set ns.b = ns %}{{ ns }}",
                                ns + "{% set ns.a = [ns] %}{{ ns | string | length }}"}) {
    const absl::Status s = render_error(src);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << src << " -> " << s;
  }
  // A list nested 100,000 deep (freeing it recursed once a level).
  absl::Status s =
      render_error(ns + "{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(std::string(s.message()).find("nest more than 256 deep"), std::string::npos) << s;
  // 200 levels of a list holding its predecessor twice: 2^200 paths for ==, repr and tojson.
  const std::string dag =
      ns + "{% for i in range(200) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}";
  for (const std::string use : {"{{ ns.x }}", "{{ ns.x == ns.x }}", "{{ ns.x | tojson }}",
                                "{{ ns.x < ns.x }}", "{{ ns.x in [ns.x] }}"}) {
    s = render_error(dag + use);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << use << " -> " << s;
  }
  // Within the limits all of it still works as Python does.
  EXPECT_EQ(render_ok(ns + "{% set ns.x = [ns.x, [1, 'a']] %}{{ ns.x }} {{ ns.x == ns.x }}"),
            "[[], [1, 'a']] True");
  EXPECT_EQ(render_ok("{% set n = namespace(a=1) %}{{ n }}"), "<Namespace {'a': 1}>");
}

TEST(ChatTemplateRender, ParsedOnceRenderedOnManyThreads) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::parse(
      "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::thread> threads;
  std::vector<std::string> out(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      ordered_json ctx = {
          {"messages", {{{"role", "user"}, {"content", " hi " + std::to_string(i)}}}},
          {"add_generation_prompt", i % 2 == 0}};
      for (int k = 0; k < 200; ++k) {
        absl::StatusOr<std::string> r = t->render(ctx);
        out[i] = r.ok() ? *r : std::string(r.status().message());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(out[i],
              "<|user|>hi " + std::to_string(i) + "\n" + (i % 2 == 0 ? "<|assistant|>" : ""));
  }
}

TEST(ChatTemplateRender, ContextMustBeAnObject) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(ordered_json::array()).ok());
  // A plain (sorted) nlohmann::json converts.
  const nlohmann::json plain = {{"b", 1}, {"a", 2}};
  EXPECT_EQ(*t->render(plain), "x");
}

}  // namespace
}  // namespace ltm

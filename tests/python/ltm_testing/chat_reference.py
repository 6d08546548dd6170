"""Reference renderers for chat templates: Python's jinja2 set up as Hugging Face transformers
sets it up, and Hugging Face's JavaScript engine (npm @huggingface/jinja) under node.

transformers (chat_template_utils) renders with ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols]), a `raise_exception(msg)` global and its own
`tojson` filter: json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
render_jinja2() does the same with Debian's python3-jinja2.

render_hf_js() feeds many (template, context) pairs to one node process; the package is installed
by scripts/setup into tests/node/node_modules (hf_js_module() says where, or why it is missing).
Each result is ("text", str) or ("error", message).
"""

import json
import os
import subprocess

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

_TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_JS_DIR = os.path.join(_TESTS_DIR, "node", "node_modules", "@huggingface", "jinja")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def jinja2_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def render_jinja2(source, context):
    try:
        return ("text", jinja2_environment().from_string(source).render(**context))
    except Exception as e:  # noqa: BLE001 (any template error is a result to compare)
        return ("error", f"{type(e).__name__}: {e}")


# Node program: one JSON object {"template", "context"} per stdin line, one result per line.
_HF_JS = r"""
import { pathToFileURL } from "node:url";
import { readFileSync } from "node:fs";
const { Template } = await import(pathToFileURL(process.argv[2]).href);
const out = [];
for (const line of readFileSync(0, "utf-8").split("\n")) {
  if (!line) continue;
  const { template, context } = JSON.parse(line);
  try {
    out.push(JSON.stringify({ text: new Template(template).render(context) }));
  } catch (e) {
    out.push(JSON.stringify({ error: String(e && e.message || e) }));
  }
}
process.stdout.write(out.join("\n") + "\n");
"""


def hf_js_module():
    """The path of the package's ESM entry point, or None when not installed."""
    entry = os.path.join(HF_JS_DIR, "dist", "index.js")
    return entry if os.path.isfile(entry) else None


def _as_results(lines):
    results = []
    for line in lines:
        obj = json.loads(line)
        results.append(("text", obj["text"]) if "text" in obj else ("error", obj["error"]))
    return results


def render_hf_js(cases, tmp_dir):
    """cases: [(template, context)] -> [result], rendered by @huggingface/jinja under node."""
    entry = hf_js_module()
    if entry is None:
        raise RuntimeError(f"{HF_JS_DIR} is missing: run scripts/setup (npm packages for tests)")
    script = os.path.join(tmp_dir, "render_hf_jinja.mjs")
    with open(script, "w") as f:
        f.write(_HF_JS)
    stdin = "".join(json.dumps({"template": t, "context": c}) + "\n" for t, c in cases)
    out = subprocess.run(["node", script, entry], input=stdin, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return _as_results(out.splitlines())


def render_ltm(tool, cases):
    """cases: [(template, context)] -> [result], rendered by runtime/chat (ltm-render-template)."""
    stdin = "".join(json.dumps({"template": t, "context": c}) + "\n" for t, c in cases)
    out = subprocess.run([tool, "--lines"], input=stdin, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return _as_results(out.splitlines())

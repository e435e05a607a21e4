"""The examples' published figures: run them, publish their records, print and write the tables.

    uv run python benchmarks/examples.py                         # run every example's train.py (its defaults), one after the other
    uv run python benchmarks/examples.py --only sql_agent        # a subset (repeat --only or give a comma list)
    uv run python benchmarks/examples.py --publish sql_agent     # runs/sql_agent/'s record into docs/runs/sql_agent/, with its curve
    uv run python benchmarks/examples.py --publish sql_agent --source runs/x --variant per_role  # docs/runs/sql_agent/variants/per_role/
    uv run python benchmarks/examples.py --report                # print the table from docs/runs/ and write the READMEs' figures
    uv run python benchmarks/examples.py --report --check        # exit 1 when a README figure differs from its record (CI)

An **example** is a folder ``examples/<name>/`` with a ``baselines.py`` (its trivial policies)
or a published run record ``docs/runs/<name>/result.json`` (:class:`agentbolt.runs.evaluation.RunRecord`:
the command, commit, date and machine of the run, and each held-out set's metric before and
after training with standard errors). The table puts beside every held-out set the scores of
the example's trivial policies on it (``trivial_scores()`` of its ``baselines.py``, run in a
process of its own): a constant answer, the most frequent answer, format-only, ... -- what a
policy that does not do the task gets -- and its rule-based solvers (``rule_scores()``: the
strongest simple rules that read the question, e.g. a regex parser for the SQL templates, BM25
plus a regex for RAG), with one sentence on what the bundled data measures
(``BUNDLED_DATA_MEASURES``): how far a rule gets on the bundled data.

``--report`` regenerates the figures between marker comments in the READMEs:
``<!-- figures:NAME -->`` ... ``<!-- /figures:NAME -->`` in ``examples/NAME/README.md`` (the
record's provenance, its held-out table, the trivial policies, the curve) and
``<!-- figures:examples -->`` / ``<!-- figures:quickstart -->`` in the top README, and
``<!-- figures:NAME-variants -->`` (the example's main run beside its published variants,
``docs/runs/NAME/variants/*/``: another setting of the same example) where a README has it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentbolt.runs.evaluation import RunRecord

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "docs" / "runs"
README = REPO / "README.md"
MAX_METRICS_BYTES = 256 * 1024
"""A published metrics.jsonl larger than this is refused (records stay small)."""
HELDOUT_ITEMS = "heldout_items.json"
"""A run's per-question held-out outcomes, published beside its record when the run wrote them
(the quickstart does): tests/examples/test_record_metrics.py recomputes the stages from them."""


# -- what there is ---------------------------------------------------------------------------------


def example_names(repo: Path = REPO) -> list[str]:
    """Examples with a ``baselines.py`` or a published record, sorted (quickstart first)."""
    with_baselines = {p.parent.name for p in (repo / "examples").glob("*/baselines.py")}
    with_records = {p.parent.name for p in (repo / "docs" / "runs").glob("*/result.json")}
    return sorted(with_baselines | with_records, key=lambda n: (n != "quickstart", n))


def load_record(name: str, runs: Path = RUNS) -> RunRecord | None:
    path = runs / name / "result.json"
    return RunRecord.load(path) if path.is_file() else None


VARIANTS = "variants"
"""``docs/runs/<example>/variants/<variant>/``: other published runs of an example (another
setting, e.g. ``--policies per-role``), compared with its main run in the README's
``<!-- figures:<example>-variants -->`` block."""


def variant_records(name: str, runs: Path = RUNS) -> dict[str, RunRecord]:
    """An example's published variant runs, by variant name (sorted)."""
    folder = runs / name / VARIANTS
    return {p.parent.name: RunRecord.load(p) for p in sorted(folder.glob("*/result.json"))}


_BASELINES_SNIPPET = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("baselines_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
data_dir = sys.argv[3] if len(sys.argv) > 3 else None
parts = sys.argv[2].split(",")
out = {
    "trivial": module.trivial_scores(data_dir) if "trivial" in parts else [],
    "rules": module.rule_scores(data_dir) if "rules" in parts and hasattr(module, "rule_scores") else [],
    "measures": getattr(module, "BUNDLED_DATA_MEASURES", None),
}
print(json.dumps(out))
"""


def baselines(
    name: str,
    repo: Path = REPO,
    env: dict[str, str] | None = None,
    data_dir: Path | None = None,
    parts: tuple[str, ...] = ("trivial", "rules"),
) -> dict[str, Any]:
    """What ``examples/<name>/baselines.py`` scores, in a process of its own (every example has its
    own ``data.py``/``agent.py``, kept apart that way): ``trivial`` (``trivial_scores(data_dir)``:
    policies that do not do the task), ``rules`` (``rule_scores(data_dir)``: rule-based solvers
    that read the question, ``[]`` where there are none) and ``measures`` (its
    ``BUNDLED_DATA_MEASURES`` sentence or ``None``). An example without a ``baselines.py`` has none."""
    path = repo / "examples" / name / "baselines.py"
    if not path.is_file():
        return {"trivial": [], "rules": [], "measures": None}
    done = subprocess.run(
        [sys.executable, "-c", _BASELINES_SNIPPET, str(path), ",".join(parts), *([str(data_dir)] if data_dir else [])],
        capture_output=True,
        text=True,
        cwd=repo,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{path}: {' and '.join(parts)} scores failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def trivial_scores(
    name: str, repo: Path = REPO, env: dict[str, str] | None = None, data_dir: Path | None = None
) -> list[dict[str, Any]]:
    """``trivial_scores(data_dir)`` of ``examples/<name>/baselines.py`` (``[]`` without one)."""
    rows: list[dict[str, Any]] = baselines(name, repo, env, data_dir, parts=("trivial",))["trivial"]
    return rows


# -- formatting ------------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _gain(record: RunRecord, name: str) -> str:
    """``+3.6 se``, the gain with the two evaluations taken as independent, and ``, +4.5 se
    paired`` (per-question differences) when the record has a paired error."""
    score = record.heldout[name]
    gain, paired = score.gain_in_se, score.paired_gain_in_se
    text = "n/a" if math.isnan(gain) else f"{gain:+.1f} se"
    return text + ("" if paired is None or math.isnan(paired) else f", {paired:+.1f} se paired")


def _label(key: str) -> str:
    return {"tool_call_rate": "tool calls", "f1": "F1"}.get(key, key.replace("_", " "))


def stage_notes(stages: dict[str, dict[str, float]]) -> str:
    """The optional per-stage measurements of a held-out set, in words.

    ``before``/``after`` stages (the main columns already hold their score) list their other
    measurements (``F1 0.19 ± 0.03 → 0.38 ± 0.04``); other stages (``base``, ``sft``, ``rl``;
    ``step 10``) are listed in order with their score and measurements.
    """
    if not stages:
        return ""
    keys = [k for s in stages.values() for k in s if k not in ("score", "se", "failed") and not k.endswith("_se")]
    keys = list(dict.fromkeys(keys))
    keys.sort(key=lambda k: list(STAGE_TIME_KEYS).index(k) if k in STAGE_TIME_KEYS else -1)  # gain, then time last
    if set(stages) == {"before", "after"}:
        parts = []
        for key in keys:
            values = [
                _f(stages[s].get(key)) + (f" ± {_f(stages[s][key + '_se'])}" if key + "_se" in stages[s] else "")
                for s in ("before", "after")
            ]
            parts.append(f"{_label(key)} {values[0]} → {values[1]}")
        return "; ".join(parts)
    chain = []
    for stage, values in stages.items():
        extra = ", ".join(_stage_value(k, values[k]) for k in keys if k in values)
        se = f" ± {_f(values['se'])}" if "se" in values else ""
        chain.append(f"{stage} {_f(values.get('score'))}{se}" + (f" ({extra})" if extra else ""))
    return " → ".join(chain)


STAGE_TIME_KEYS = {
    "gain_z": "{:+.1f} se",
    "paired_gain_z": "{:+.1f} se paired",
    "training_s": "{:.0f} s of training",
}
"""Per-stage measurements written in words: the gain over the first stage in standard errors
(the two evaluations taken as independent, then paired by question), and the training time
(evaluations excluded) the run had spent when the stage was measured."""


def _stage_value(key: str, value: float) -> str:
    if key in STAGE_TIME_KEYS:
        return "n/a" if math.isnan(value) else STAGE_TIME_KEYS[key].format(value)
    return f"{_label(key)} {_f(value, 2)}"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def best_trivial(trivial: list[dict[str, Any]], heldout: str, metric: str, n: int | None = None) -> str:
    """The highest trivial-policy score on a set and metric: ``0.058 (most_frequent)``, with the
    number of questions it was scored on when that is not ``n`` (``0.058 (most_frequent, n = 120)``)."""
    rows = [r for r in trivial if r["heldout"] == heldout and r["metric"] == metric]
    if not rows:
        return "n/a"
    best = max(rows, key=lambda r: r["score"])
    return f"{_f(best['score'])} ({best['policy']}" + (f", n = {best['n']})" if best["n"] != n else ")")


def example_block(
    name: str,
    record: RunRecord | None,
    trivial: list[dict[str, Any]],
    rules: list[dict[str, Any]] | None = None,
    measures: str | None = None,
) -> str:
    """The figures of one example README: provenance, held-out table, trivial policies, the
    rule-based solvers with what the bundled data measures, curve."""
    rules = rules or []
    lines: list[str] = []
    if record is None:
        lines.append(f"No published run record yet (`docs/runs/{name}/result.json`).")
    else:
        commit = record.commit[:12] + ("+dirty" if record.commit.endswith("+dirty") else "")
        lines.append(
            f"From the run record [`docs/runs/{name}/`](../../docs/runs/{name}/result.json): "
            f"`{record.command}` at commit `{commit}` on {record.date} ({record.machine}); {record.model}, "
            f"{record.steps} steps, {_f(record.s_per_step, 1)} s/step, {_f(record.wall_s / 60, 1)} min in all. "
            f"Held-out metric before → after training, ± its standard error; headline: `{record.headline}`."
        )
        lines.append("")
        rows = []
        for set_name, score in record.heldout.items():
            rows.append(
                [
                    f"**{set_name}**" if record.headline.startswith(f"{set_name}/") else set_name,
                    score.metric.replace("_", " "),
                    str(score.n),
                    f"{_f(score.before)} ± {_f(score.before_se)}",
                    f"{_f(score.after)} ± {_f(score.after_se)}",
                    _gain(record, set_name),
                    stage_notes(score.stages) or "—",
                    best_trivial(trivial, set_name, score.metric, score.n),
                    *([best_trivial(rules, set_name, score.metric, score.n)] if rules else []),
                ]
            )
        header = ["held-out set", "metric", "n", "before", "after", "gain", "more", "best trivial policy"]
        header += ["best rule-based solver"] if rules else []
        lines += _table(header, rows)
    if record is not None:
        differs = []
        for set_name, score in record.heldout.items():
            sizes = {r["n"] for r in trivial if r["heldout"] == set_name}
            if sizes and sizes != {score.n}:
                shown = ", ".join(map(str, sorted(sizes)))
                differs.append(f"{set_name} (the run: {score.n}, the trivial policies: {shown})")
        if differs:
            lines += ["", f"The run and the trivial policies saw different numbers of questions: {'; '.join(differs)}."]
    if trivial:
        lines += ["", f"Trivial policies (`examples/{name}/baselines.py`, scored by the example's own scoring):", ""]
        lines += _table(
            ["held-out set", "policy", "metric", "score", "n"],
            ([r["heldout"], r["policy"], r["metric"].replace("_", " "), _f(r["score"]), str(r["n"])] for r in trivial),
        )
    if rules:
        lines += [
            "",
            f"Rule-based solvers (`examples/{name}/baselines.py`: rules that read the question, no model):",
            "",
        ]
        lines += _table(
            ["held-out set", "solver", "metric", "score", "n"],
            ([r["heldout"], r["policy"], r["metric"].replace("_", " "), _f(r["score"]), str(r["n"])] for r in rules),
        )
    if measures:
        lines += ["", f"What the bundled data measures: {measures}"]
    if record is not None and (RUNS / name / "curve.png").is_file():
        lines += ["", f"![training curve of the published run](../../docs/runs/{name}/curve.png)"]
    return "\n".join(lines)


PAPER_EXAMPLES = ("sql_agent", "rag_agent", "calc_agent")
"""The top README's table always has a row for these, with or without a published run."""


def _trivial_beside(
    trivial: list[dict[str, Any]], heldout: str, metric: str, stages: dict[str, dict], n: int | None
) -> str:
    """The best trivial policy on the headline metric, then on each other metric the stages report
    (``0.000 (constant); F1 0.042 (generic_word)``)."""
    text = best_trivial(trivial, heldout, metric, n)
    others = dict.fromkeys(k for s in stages.values() for k in s if k not in ("score", "se", metric))
    for key in others:
        if any(r["heldout"] == heldout and r["metric"] == key for r in trivial):
            text += f"; {_label(key)} {best_trivial(trivial, heldout, key, n)}"
    return text


def examples_table(
    names: list[str],
    records: dict[str, RunRecord | None],
    trivial: dict[str, list],
    rules: dict[str, list] | None = None,
) -> str:
    """The top README's table: every example's held-out sets before → after (± se, n), what else
    each stage measured (F1, tool-call rates, ...), beside the best trivial policy; an example of
    :data:`PAPER_EXAMPLES` without a record gets a "no published run yet" row."""
    rules = rules or {}
    with_rules = any(rules.values())
    rows = []
    ordered = [*PAPER_EXAMPLES, *(n for n in names if n not in PAPER_EXAMPLES)]
    for name in ordered:
        record = records.get(name)
        link = f"[`{name}`](examples/{name})"
        if record is None:
            if name not in PAPER_EXAMPLES:
                continue
            rows_of = trivial.get(name, [])
            for set_name in dict.fromkeys(r["heldout"] for r in rows_of) or ["—"]:
                metrics = dict.fromkeys(r["metric"] for r in rows_of if r["heldout"] == set_name)
                best = "; ".join(
                    f"{_label(m) if len(metrics) > 1 else ''} {best_trivial(rows_of, set_name, m)}".strip()
                    for m in metrics
                )
                rows.append(
                    [
                        link,
                        set_name,
                        "; ".join(_label(m) for m in metrics) or "—",
                        f"no published run yet (`docs/runs/{name}/result.json`)",
                        "—",
                        "—",
                        best or "—",
                        *(
                            [best_trivial(rules.get(name, []), set_name, next(iter(metrics)))]
                            if with_rules and metrics
                            else ["—"]
                            if with_rules
                            else []
                        ),
                        "—",
                    ]
                )
            continue
        for set_name, score in record.heldout.items():
            headline = record.headline.startswith(f"{set_name}/")
            rows.append(
                [
                    link,
                    f"**{set_name}**" if headline else set_name,
                    f"{score.metric.replace('_', ' ')} (n = {score.n})",
                    f"{_f(score.before)} ± {_f(score.before_se)} → {_f(score.after)} ± {_f(score.after_se)}",
                    _gain(record, set_name),
                    stage_notes(score.stages) or "—",
                    _trivial_beside(trivial.get(name, []), set_name, score.metric, score.stages, score.n),
                    *([best_trivial(rules.get(name, []), set_name, score.metric, score.n)] if with_rules else []),
                    f"{record.steps} steps, {_f(record.wall_s / 60, 1)} min ({record.date}, `{record.commit[:7]}`)",
                ]
            )
    header = ["example", "held-out set", "metric", "before → after (± se)", "gain", "more", "best trivial"]
    header += ["best rule-based solver", "run"] if with_rules else ["run"]
    return "\n".join(_table(header, rows))


def quickstart_block(
    record: RunRecord | None,
    trivial: list[dict[str, Any]],
    rules: list[dict[str, Any]] | None = None,
    measures: str | None = None,
) -> str:
    """The top README's paragraph on the quickstart's published run."""
    if record is None:
        return "No published quickstart run yet (`docs/runs/quickstart/result.json`)."
    name = record.headline.partition("/")[0]
    score = record.heldout[name]
    notes = stage_notes(score.stages)
    extra = record.extra
    text = (
        f"[`docs/runs/quickstart/`](docs/runs/quickstart/result.json): `{record.command}` at commit "
        f"`{record.commit[:12]}` on {record.date} ({record.machine}), {record.model}. Held-out accuracy "
        f"**{_f(score.before)} ± {_f(score.before_se)} → {_f(score.after)} ± {_f(score.after_se)}** "
        f"(n = {score.n}, one sample each at T = 1.0; {_gain(record, name)}"
        + (f"; {notes}" if notes else "")
        + f") after {record.steps} steps, {_f(record.s_per_step, 1)} s per step, "
        f"{_f(record.wall_s / 60, 1)} minutes in all"
    )
    if "time/rollouts_s" in extra and "time/update_s" in extra:
        text += f" (per step: rollouts {_f(extra['time/rollouts_s'], 1)} s, update {_f(extra['time/update_s'], 1)} s"
        if "engine/prompt_tokens" in extra and "engine/cached_prompt_tokens" in extra:
            text += (
                f"; {extra['engine/prompt_tokens']:,.0f} prompt tokens computed, "
                f"{extra['engine/cached_prompt_tokens']:,.0f} served from the prompt cache"
            )
        text += ")"
    text += f". Best trivial policy: {best_trivial(trivial, name, score.metric, score.n)}"
    if rules:
        text += f"; best rule-based solver: {best_trivial(rules, name, score.metric, score.n)}"
    return text + "." + (f" {measures}" if measures else "")


# -- the README blocks ----------------------------------------------------------------------------


def _setting(record: RunRecord) -> str:
    """What a run trained, from its record's ``extra``: policies, LoRA rank, learning rate."""
    extra = record.extra
    policies = extra.get("policies", "shared")
    names = extra.get("policy_names") or []
    rank = extra.get("lora_rank")
    weights = (
        "full fine-tune"
        if rank is None
        else f"LoRA rank {rank}" + (f", {len(names)} adapters" if len(names) > 1 else "")
    )
    lr = f", lr {extra['lr']:g}" if "lr" in extra else ""
    return f"{policies} ({weights}{lr})"


def variants_block(name: str, main: RunRecord | None, variants: dict[str, RunRecord]) -> str:
    """The README table comparing an example's main run with its variants (held-out sets before
    → after ± se, s/step, the trainer's peak RSS), each from its record."""
    runs = [(f"`docs/runs/{name}/`", main)] if main is not None else []
    runs += [(f"`docs/runs/{name}/{VARIANTS}/{v}/`", r) for v, r in variants.items()]
    if not runs:
        return f"No published runs to compare yet (`docs/runs/{name}/{VARIANTS}/`)."
    sets = list(dict.fromkeys(s for _, r in runs for s in r.heldout))
    header = [
        "run (record)",
        "setting",
        *[f"{s} before → after (n)" for s in sets],
        "s/step",
        "trainer peak RSS",
        "commit",
    ]
    rows = []
    for where, record in runs:
        cells = [where, _setting(record)]
        for set_name in sets:
            score = record.heldout.get(set_name)
            cells.append(
                "—"
                if score is None
                else f"{_f(score.before)} ± {_f(score.before_se)} → **{_f(score.after)} ± {_f(score.after_se)}** "
                f"({score.n}; {_gain(record, set_name)})"
            )
        rss = record.extra.get("peak_rss_gb")
        cells += [
            _f(record.s_per_step, 1),
            "not recorded" if rss is None else f"{rss:.1f} GB",
            f"`{record.commit[:7]}`, {record.date}",
        ]
        rows.append(cells)
    return "\n".join(_table(header, rows))


def replace_block(text: str, marker: str, body: str) -> str:
    """``text`` with the lines between ``<!-- figures:MARKER -->`` and ``<!-- /figures:MARKER -->`` replaced."""
    pattern = re.compile(rf"(<!-- figures:{re.escape(marker)} -->\n).*?(<!-- /figures:{re.escape(marker)} -->)", re.S)
    if not pattern.search(text):
        raise LookupError(f"no '<!-- figures:{marker} -->' ... '<!-- /figures:{marker} -->' block")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


def readme_updates(
    repo: Path = REPO,
    env: dict[str, str] | None = None,
    trivial: dict[str, list[dict[str, Any]]] | None = None,
    rules: dict[str, list[dict[str, Any]]] | None = None,
    measures: dict[str, str | None] | None = None,
) -> dict[Path, str]:
    """Every README whose figures come from records, with its blocks regenerated (path -> new text).

    ``trivial``, ``rules``, ``measures``: each example's trivial-policy rows, rule-based solver
    rows and sentence on what its bundled data measures (:func:`baselines`), when already
    computed (else each ``baselines.py`` runs, with ``env`` added to its environment).
    """
    names = example_names(repo)
    runs = repo / "docs" / "runs"
    records = {name: load_record(name, runs) for name in names}
    if trivial is None or rules is None or measures is None:
        computed = {name: baselines(name, repo, env) for name in names}
        trivial = trivial if trivial is not None else {n: b["trivial"] for n, b in computed.items()}
        rules = rules if rules is not None else {n: b["rules"] for n, b in computed.items()}
        measures = measures if measures is not None else {n: b["measures"] for n, b in computed.items()}
    out: dict[Path, str] = {}
    for name in names:
        path = repo / "examples" / name / "README.md"
        if path.is_file() and f"<!-- figures:{name} -->" in path.read_text(encoding="utf-8"):
            text = replace_block(
                path.read_text(encoding="utf-8"),
                name,
                example_block(name, records[name], trivial[name], rules.get(name), measures.get(name)),
            )
            if f"<!-- figures:{name}-variants -->" in text:
                text = replace_block(
                    text, f"{name}-variants", variants_block(name, records[name], variant_records(name, runs))
                )
            out[path] = text
    top = (repo / "README.md").read_text(encoding="utf-8")
    table_names = [n for n in names if n != "quickstart"]
    top = replace_block(top, "examples", examples_table(table_names, records, trivial, rules))
    top = replace_block(
        top,
        "quickstart",
        quickstart_block(
            records.get("quickstart"),
            trivial.get("quickstart", []),
            rules.get("quickstart"),
            measures.get("quickstart"),
        ),
    )
    out[repo / "README.md"] = top
    return out


def print_table(
    names: list[str],
    trivial: dict[str, list[dict[str, Any]]],
    runs: Path = RUNS,
    rules: dict[str, list[dict[str, Any]]] | None = None,
) -> None:
    """The console table: held-out sets before -> after, gains, every trivial policy and rule-based solver."""
    for name in names:
        record = load_record(name, runs)
        print(f"== {name}")
        if record is None:
            print(f"   no record ({runs / name / 'result.json'})")
        else:
            print(f"   {record.command}  [{record.commit[:12]}, {record.date}, {record.machine}]")
            for set_name, score in record.heldout.items():
                print(
                    f"   {set_name:<12} {score.metric:<20} {_f(score.before)} +- {_f(score.before_se)} -> "
                    f"{_f(score.after)} +- {_f(score.after_se)} (n={score.n}, {_gain(record, set_name)})"
                    + (f"  {stage_notes(score.stages)}" if score.stages else "")
                )
        for kind, rows in (("trivial", trivial.get(name, [])), ("rule", (rules or {}).get(name, []))):
            for row in rows:
                print(
                    f"   {kind:<8} {row['heldout']:<12} {row['policy']:<18} {row['metric']:<20} {_f(row['score'])} "
                    f"(n={row['n']})"
                )


# -- running and publishing -----------------------------------------------------------------------


def run_example(name: str, extra: list[str]) -> int:
    """Run ``examples/<name>/train.py`` with its defaults (plus ``extra``); returns its exit status."""
    script = REPO / "examples" / name / "train.py"
    if not script.exists():
        print(f"{name}: skipped ({script} does not exist)", flush=True)
        return 0
    command = [sys.executable, str(script), "--no-progress", *extra]
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    status = subprocess.run(command, cwd=REPO, check=False).returncode
    print(f"== {name}: exit {status} after {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return status


def plot_record(record: RunRecord, metrics: Path | None, out: Path) -> Path:
    """The published curve (:func:`record_figure`) written to ``out``."""
    fig = record_figure(record, metrics)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def record_figure(record: RunRecord, metrics: Path | None) -> Any:
    """The published curve as a matplotlib ``Figure``: training reward per step (from
    ``metrics.jsonl``; whole-step ticks, the legend below the axes so that it hides no point) and
    every held-out set's metric before and after (or at each stage), with standard-error bars and
    each set's n (from the record)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    from agentbolt_torch.training.metrics import plot_reward, read_metrics

    plot_reward(left, read_metrics(metrics) if metrics is not None and metrics.is_file() else [])
    left.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    left.set(title="training reward", xlabel="step", ylabel="mean reward of the step's rollouts")
    for name, score in record.heldout.items():
        staged = [(k, v) for k, v in score.stages.items() if "score" in v and set(score.stages) != {"before", "after"}]
        points = [(k, v["score"], v.get("se", 0.0)) for k, v in staged] or [
            ("before", score.before, score.before_se),
            ("after", score.after, score.after_se),
        ]
        labels, ys, errors = zip(*points, strict=True)
        label = f"{name.replace('_', ' ')} (n={score.n})"
        right.errorbar(range(len(ys)), ys, yerr=errors, marker="o", capsize=4, label=label)
        right.set_xticks(range(len(labels)), labels)
    metric = next(iter(record.heldout.values())).metric.replace("_", " ")
    right.set(title=f"held-out {metric}, mean ± 1 se", ylim=(-0.03, 1.03))  # a point at 0 or 1 shows whole
    right.margins(x=0.1)
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(record.heldout), frameon=False)
    fig.suptitle(f"{record.example}: {record.model}, {record.steps} steps ({record.date}, {record.commit[:7]})")
    fig.tight_layout()
    return fig


def publish(name: str, source: Path, runs: Path = RUNS, variant: str | None = None) -> Path:
    """Copy a run's record (validated) and metrics from ``source`` into ``runs/<name>/`` (or
    ``runs/<name>/variants/<variant>/``) and draw its curve there from them (:func:`plot_record`)."""
    record = RunRecord.load(source / "result.json")
    if record.example != name:
        raise ValueError(f"{source / 'result.json'} is a record of {record.example!r}, not {name!r}")
    metrics = source / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > MAX_METRICS_BYTES:
        raise ValueError(f"{metrics} is {metrics.stat().st_size:,} bytes (> {MAX_METRICS_BYTES:,}); trim it first")
    target = runs / name if variant is None else runs / name / VARIANTS / variant
    target.mkdir(parents=True, exist_ok=True)
    for file in ("result.json", "metrics.jsonl", HELDOUT_ITEMS):
        if (source / file).is_file():
            shutil.copyfile(source / file, target / file)
    plot_record(record, target / "metrics.jsonl", target / "curve.png")
    return target


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", default=[], help="examples to run or report (default: all)")
    p.add_argument("--report", action="store_true", help="print the table from docs/runs/ and write the READMEs")
    p.add_argument("--check", action="store_true", help="with --report: write nothing, exit 1 if a README differs")
    p.add_argument("--publish", metavar="NAME", help="copy runs/NAME (or --source) into docs/runs/NAME")
    p.add_argument("--source", type=Path, help="with --publish: the run's --out folder (default runs/NAME)")
    p.add_argument("--variant", help="with --publish: publish as docs/runs/NAME/variants/VARIANT (another setting)")
    p.add_argument("extra", nargs="*", help="arguments passed to every train.py (after --)")
    args = p.parse_args(argv)
    known = example_names()
    args.names = [n for item in args.only for n in item.split(",") if n] or known
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        p.error(f"unknown example(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.publish:
        target = publish(args.publish, args.source or REPO / "runs" / args.publish, variant=args.variant)
        print(f"published {args.publish}: {', '.join(sorted(p.name for p in target.iterdir()))} in {target}")
        return 0
    if args.report:
        computed = {name: baselines(name) for name in example_names()}
        trivial = {n: b["trivial"] for n, b in computed.items()}
        rules = {n: b["rules"] for n, b in computed.items()}
        measures = {n: b["measures"] for n, b in computed.items()}
        print_table(args.names, trivial, rules=rules)
        stale = []
        for path, text in readme_updates(trivial=trivial, rules=rules, measures=measures).items():
            if path.read_text(encoding="utf-8") != text:
                stale.append(path)
                if not args.check:
                    path.write_text(text, encoding="utf-8")
        verb = "differ from their records" if args.check else "rewritten from the records"
        print(f"READMEs {verb}: {', '.join(str(p.relative_to(REPO)) for p in stale) or 'none'}")
        return 1 if args.check and stale else 0
    failed = [name for name in args.names if run_example(name, args.extra) != 0]
    computed = {name: baselines(name) for name in args.names}
    print_table(
        args.names,
        {n: b["trivial"] for n, b in computed.items()},
        REPO / "runs",
        rules={n: b["rules"] for n, b in computed.items()},
    )
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""No figure in prose without its file: every ratio, interval, range of optimizer values, optimizer value (in
s, samples/s, or after the optimizer's name), "N% above X's", count of trials, rounds trained, spread-study CV
and statement about the paired intervals that docs/claims.md's claim bullets and its other paragraphs
attribute to a measurement, checked against the committed file it comes from: reproduce/claims/claims.json
(current figures), the committed versions of reproduce/claims/claims.md in git (former figures, "Before ...
0.94x [0.85x, 1.01x]"), the claim's tuning folder (rounds trained, speed references, drift-adjusted scores),
and the paired and spread tables of docs/claims.md; and each bullet's verdict against the claim's. A figure
from elsewhere is listed in ELSEWHERE with where it comes from. Speed-ups with an interval quoted as current
have their own test (tests/test_claims.py::test_every_current_figure_the_prose_quotes_is_a_committed_claims).
The README quotes no figure: it names each verdict's claims and links docs/claims.md."""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
import subprocess
from pathlib import Path

import pytest

from tests.test_claims import quoted_figures
from wagma_bench.analysis.tuning import load_trials, trial_finished

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "claims.md"
# docs/claims.md's section of claim bullets (each checked against its own claim by the bullet tests below),
# and the section after it, of measurements other than the claims (checked where they are generated:
# tests/test_generated_docs.py)
BULLETS_SECTION, OTHER_SECTION, AFTER = (
    "## What the table says, claim by claim",
    "## Other measurements",
    "## The command",
)
CLAIMS_MD = "reproduce/claims/claims.md"
NAMES = {
    "Allreduce-SGD": "allreduce",
    "WAGMA-SGD": "wagma",
    "local SGD": "local_sgd",
    "D-PSGD": "dpsgd",
    "AD-PSGD": "adpsgd",
    "SGP": "sgp",
    "eager-SGD": "eager",
}
# docs/claims.md's bullet for each claim, by its heading after the verdict
BULLETS = {
    "WAGMA-SGD's throughput under injected stragglers": "resnet-stragglers-throughput",
    "time to accuracy under stragglers": "resnet-stragglers-time-to-accuracy",
    "the Transformer's time to solution.": "transformer-time-to-solution",
    "the Transformer with sentence batches": "transformer-sentences-time-to-solution",
    "the Transformer's final BLEU at a fixed budget": "transformer-final-bleu",
    "RL throughput": "rl-throughput-1024",
    "DD-PPO's final quality at a fixed budget": "rl-final-quality",
    "PR-SGD's local SGD against synchronous SGD": "prsgd-local-sgd-speedup",
}
# figures that come from a file other than the claims' own, each with where it is checked or measured
ELSEWHERE = {
    (
        "resnet-stragglers-time-to-accuracy",
        "2x",
    ): "docs/tests.md#ten-minutes (WAGMA-SGD's time at the defaults)",
    (
        "resnet-stragglers-time-to-accuracy",
        "0.95-0.96",
    ): "the trials' evaluations (their event logs), not checked",
    ("resnet-stragglers-throughput", "0.32"): "the condition: the authors' injected sleep, not a measurement",
    (
        "resnet-stragglers-throughput",
        "44%",
    ): "the condition: the authors' rule at 4 ranks (docs/imbalance.md)",
    (
        "transformer-time-to-solution",
        "6",
    ): "former: the 2026-12-02 tuning's scores (git history), not checked",
}
NUMBER = r"[+-]?\d[\d,]*(?:\.\d+)?"
WHO = "|".join(sorted(map(re.escape, NAMES), key=len, reverse=True))  # AD-PSGD before D-PSGD
RATIO = re.compile(rf"(?<![\w.])({NUMBER})x\b")
BRACKET = re.compile(
    r"\[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]"
)  # an interval written without its x: "[0.85, 1.01]"
VALUE = r"\d{1,3}(?:,\d{3})*(?:\.\d+)?|\d+(?:\.\d+)?"
RANGE = re.compile(rf"(?<![\w.,:-])({VALUE})-({VALUE})(?![\w.%x]|-\d| ?%)")
UP_TO = re.compile(r"\bup to (\d+)\b(?!\.\d)")  # "up to 0.16" is no count of rounds
MEDIAN = re.compile(r"\b(\d+) (?:rounds )?in the median\b")


def _claims() -> dict[str, dict]:
    return {r["id"]: r for r in json.loads((ROOT / "reproduce/claims/claims.json").read_text())["claims"]}


def _value(text: str) -> float:
    return float(text.replace(",", "").rstrip("x"))


def _decimals(text: str) -> int:
    text = text.replace(",", "").rstrip("x")
    return len(text.split(".")[1]) if "." in text else 0


def matches(written: str, values) -> bool:
    """``written`` is one of ``values`` at the precision it is written with (701 for 701.34, 0.89x for
    0.8937)."""
    d, v = _decimals(written), _value(written)
    return any(round(x, d) == v for x in values if x is not None and abs(x) != float("inf"))


@functools.cache
def history_rows() -> dict[str, list[str]]:
    """Each claim's row of the summary table in every committed version of reproduce/claims/claims.md. A test
    that needs them is skipped, saying so, in a clone without that history (``git clone --depth 1``)."""
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("former figures are checked against every committed claims.md: this clone has no history")
    shas = subprocess.run(
        ["git", "log", "--format=%H", "--", CLAIMS_MD], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    rows: dict[str, list[str]] = {}
    for sha in shas:
        text = subprocess.run(
            ["git", "show", f"{sha}:{CLAIMS_MD}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for m in re.finditer(r"^\| `([\w-]+)` \|.*$", text, re.MULTILINE):
            rows.setdefault(m.group(1), []).append(re.sub(r" vs [\w-]+", "", m.group(0)))
    return rows


def current_ratios(r: dict) -> list[float]:
    """Every speed-up figure claims.json holds for a claim: measured and drift-adjusted with their intervals,
    the prediction with its interval, its range over the structures and the curves of its flip conditions, and
    the paper's own figure."""
    out = []
    for part in (r["measured"], r.get("predicted") or {}):
        out += [part.get("speedup"), *(part.get("interval") or [])]
    out += ((r.get("predicted") or {}).get("structural_range") or {}).get("range", [])
    out += speedups(r.get("drift_adjusted") or {})
    for flip in (r.get("predicted") or {}).get("flips", []):
        if flip["knob"] == "control_every":  # "with the suite's barrier every 10 rounds ... (1.04x)"
            out.append(flip["curve"][-1][1])
    out += [_value(x) for x in re.findall(r"(\d+(?:\.\d+)?)x", r.get("figure") or "")]
    return out


def speedups(part) -> list[float]:
    """Every speed-up and interval end in ``part`` at any depth (a drift adjustment may carry more than
    one)."""
    if isinstance(part, dict):
        return [
            v
            for key, value in part.items()
            for v in (
                speedups(value)
                if isinstance(value, dict)
                else _numbers(value)
                if "speedup" in key or "interval" in key
                else []
            )
        ]
    return []


def _numbers(value) -> list[float]:
    if isinstance(value, list):
        return [v for item in value for v in _numbers(item)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def former_ratios(claim: str) -> list[float]:
    out = []
    for row in history_rows().get(claim, []):
        out += [_value(x) for x in re.findall(rf"({NUMBER})x", row)]
        out += [_value(x) for pair in BRACKET.findall(row) for x in pair]  # a difference's interval: no x
    return out


def steps(r: dict) -> dict[str, list[int]]:
    """Each optimizer's rounds trained, trial by trial, in the claim's tuning folder."""
    _, combos, summaries = load_trials(ROOT / r["measured"]["source"])
    out: dict[str, list[int]] = {}
    for trials in combos.values():
        for t in trials:
            s = summaries[t.name]
            if trial_finished(s) and s.rounds:
                out.setdefault(s.optimizer, []).append(int(s.rounds))
    return out


def named(sentence: str) -> list[str]:
    return [key for name, key in NAMES.items() if name in sentence]


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.;:])\s+(?=[A-Z(])", text)


# --- the checks, each returning what it found wrong ---------------------------------------------------------


def ratio_problems(text: str, claims: list[dict]) -> list[str]:
    """A ratio must be a current or former figure of one of ``claims`` (at the precision written)."""
    values = [v for r in claims for v in current_ratios(r) + former_ratios(r["id"])]
    ids = {r["id"] for r in claims}
    written = [(m.group(0), m.group(1)) for m in RATIO.finditer(text)]
    written += [(f"{end} of {m.group(0)}", end) for m in BRACKET.finditer(text) for end in m.groups()]
    return [
        f"{said} is no figure of {sorted(ids)} in claims.json or a committed claims.md"
        for said, value in written
        if not matches(value, values) and not any((i, said) in ELSEWHERE for i in ids)
    ]


def former_interval_problems(text: str, claim: str) -> list[str]:
    """A speed-up with an interval quoted as a former one must be in a committed claims.md's row for it."""
    _, former = quoted_figures(text)
    rows = history_rows().get(claim, [])
    return [
        f"{f} (said to be former) is in no committed claims.md row of {claim}"
        for f in former
        if not any(f.split(" [")[0] in row and "[" + f.split(" [")[1] in row for row in rows)
    ]


def _listed(values: list) -> str:
    """Optimizers' values in order, a miss (inf, which claims.json holds as null) last as ∞."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    return ", ".join("∞" if v is None else f"{v:.2f}" for v in ordered)


def range_problems(text: str, r: dict) -> list[str]:
    """A range of values ("701-704", "36-43 s") runs from one optimizer's value to another's, as claims.json
    holds them; a range of rounds from one trial's rounds to another's."""
    values = [m["value"] for m in r["measured"]["optimizers"].values()]
    rounds = [s for v in steps(r).values() for s in v]
    out = []
    for m in RANGE.finditer(text):
        if (r["id"], m.group(0)) in ELSEWHERE:
            continue
        pool = rounds if text[m.end() :].startswith(" rounds") else values
        bad = [end for end in m.groups() if not matches(end, pool)]
        if bad:
            out.append(
                f"{m.group(0)}: {', '.join(bad)} is no {'trial' if pool is rounds else 'optimizer'} value "
                f"of {r['id']} (optimizers: {_listed(values)})"
            )
    return out


def step_problems(text: str, r: dict) -> list[str]:
    """ "up to N" rounds is the most a trial trained, "N in the median" an optimizer's median, of the
    optimizer the sentence names (any, where it names none) in the claim's tuning folder."""
    trained = steps(r)
    out = []
    for sentence in sentences(text):
        who = [o for o in named(sentence) if o in trained] or list(trained)
        for m in UP_TO.finditer(sentence):
            most = max(max(trained[o]) for o in who)
            if int(m.group(1)) != most:
                out.append(
                    f"up to {m.group(1)} rounds ({', '.join(who)}): {r['measured']['source']} says {most}"
                )
        for m in MEDIAN.finditer(sentence):
            medians = {o: statistics.median(trained[o]) for o in who}
            if int(m.group(1)) not in medians.values():
                out.append(
                    f"{m.group(1)} in the median ({', '.join(who)}): {r['measured']['source']} says {medians}"
                )
    return out


UNIT_VALUE = re.compile(rf"(?<![\w.,-])({VALUE}) (?:s|samples/s)\b")
WHO_VALUE = re.compile(
    rf"(?<![\w-])(?:{WHO})(?:'s)?(?: score,| score is)? ({VALUE})(?![\w.%x-]|,\d| (?:rounds|trials|ranks)\b)"
)
PERCENT_OF = re.compile(rf"(\d+)% (above|below) (?:tuned )?({WHO})'s ({VALUE})")
TRIALS = re.compile(r"(?<!x )(?<![\w.,-])(\d+) trials\b")


@functools.cache
def optimizer_values(claim: str) -> tuple[float, ...]:
    """Every value claims.json holds for a claim's optimizers, the same scaled by the speed reference (the
    drift-adjusted scores) and each optimizer's median speed reference, from the claim's tuning folder."""
    from wagma_bench.analysis.claims import drift_reference

    r = _claims()[claim]
    values = [m["value"] for m in r["measured"]["optimizers"].values()]
    values += _numbers(
        list(((r.get("drift_adjusted") or {}).get("values") or {}).values())
    )  # at the fitted e
    source = ROOT / r["measured"]["source"]
    median, _, _ = drift_reference(source)
    if median is not None:
        _, _, summaries = load_trials(source)
        refs: dict[str, list[float]] = {}
        for s in summaries.values():
            if trial_finished(s) and s.reference_s:
                refs.setdefault(s.optimizer, []).append(s.reference_s)
        values += [statistics.median(v) for v in refs.values()]
    return tuple(values)


def value_problems(text: str, r: dict) -> list[str]:
    """A value in seconds or samples/s, or one that follows an optimizer's name ("Allreduce-SGD's 543"), is an
    optimizer's value of the claim (raw, drift-adjusted, or its speed reference); "8% above Allreduce-SGD's
    543" is the subject's value against that one; "175 trials" the trials the claim measured."""
    values = optimizer_values(r["id"])
    out = []
    for m in [*UNIT_VALUE.finditer(text), *WHO_VALUE.finditer(text)]:
        if (r["id"], m.group(1)) not in ELSEWHERE and not matches(m.group(1), values):
            out.append(f"{m.group(0)}: {m.group(1)} is no optimizer's value of {r['id']}")
    subject = r["measured"]["optimizers"][r["subject"]]["value"]
    for m in PERCENT_OF.finditer(text):
        other = r["measured"]["optimizers"][NAMES[m.group(3)]]["value"]
        said = (1 if m.group(2) == "above" else -1) * int(m.group(1))
        if round(100 * (subject / other - 1)) != said:
            out.append(
                f"{m.group(0)}: {r['subject']}'s {subject:.1f} is {100 * (subject / other - 1):+.1f}% of it"
            )
    finished = sum(m["finished"] for m in r["measured"]["optimizers"].values())
    out += [
        f"{m.group(0)}: {r['id']} measured {finished}"
        for m in TRIALS.finditer(text)
        if int(m.group(1)) != finished
    ]
    return out


def spread_cvs() -> list[float]:
    """The coefficients of variation of docs/claims.md's spread table (tests/test_generated_docs.py checks it
    is spread.py's output of the committed study)."""
    block = re.search(r"<!-- spread:begin -->\n(.*?)\n<!-- spread:end -->", DOC.read_text(), re.DOTALL).group(
        1
    )
    return [float(x) for x in re.findall(r", (\d\.\d\d) \|", block)]


SPREAD = re.compile(r"(?<!differ from 1 )\bby (\d+)(?:-(\d+))?%|(\d+)% from the machine")
DIFFER = re.compile(r"The three Transformer claims' point figures differ from 1 by (\d+)-(\d+)%")


def spread_problems(text: str) -> list[str]:
    """ "moves by 9%", "by 9-12%", "2% from the machine": coefficients of variation of the spread study."""
    cvs = [100 * v for v in spread_cvs()]
    return [
        f"{m.group(0)}: {x}% is no CV of the spread table ({sorted(set(cvs))})"
        for m in SPREAD.finditer(text)
        for x in m.groups()
        if x and not matches(x, cvs)
    ]


def differ_problems(text: str, claims: dict[str, dict]) -> list[str]:
    """ "The three Transformer claims' point figures differ from 1 by 0-8%": from the nearest to the
    farthest."""
    gaps = sorted(
        round(100 * abs(1 - r["measured"]["speedup"]))
        for c, r in claims.items()
        if c.startswith("transformer")
    )
    return [
        f"{m.group(0)}: claims.json's differ by {gaps}"
        for m in DIFFER.finditer(text)
        if (int(m.group(1)), int(m.group(2))) != (gaps[0], gaps[-1])
    ]


def claim_problems(text: str, r: dict) -> list[str]:
    text = " ".join(text.split())
    return (
        ratio_problems(text, [r])
        + former_interval_problems(text, r["id"])
        + range_problems(text, r)
        + step_problems(text, r)
        + value_problems(text, r)
        + (spread_problems(text) if r["id"].startswith("transformer") else [])
    )


# --- the claims' bullets -----------------------------------------------------------------------------------


def readme_bullets() -> dict[str, tuple[str, str]]:
    """Each claim's bullet in docs/claims.md's section on what the table says (the README's until it became a
    front door): (the verdict its heading gives, its text)."""
    text = DOC.read_text()
    section = text[text.index(BULLETS_SECTION) : text.index(OTHER_SECTION)]
    out = {}
    for bullet in section.split("\n- ")[1:]:
        m = re.match(r"\*\*([\w ]+): (.+?)\*\*", bullet)
        assert m and m.group(2) in BULLETS, f"a claim bullet with an unknown heading: {bullet[:80]!r}"
        out[BULLETS[m.group(2)]] = (m.group(1), bullet)
    return out


def test_every_claim_has_its_bullet_with_its_verdict():
    claims, bullets = _claims(), readme_bullets()
    assert set(bullets) == set(claims)
    for cid, (verdict, _) in bullets.items():
        assert verdict.lower() == claims[cid]["verdict"], f"{cid}: the bullet says {verdict}"


@pytest.mark.parametrize("claim", sorted(BULLETS.values()))
def test_readme_bullet_figures_are_in_their_files(claim):
    problems = claim_problems(readme_bullets()[claim][1], _claims()[claim])
    assert not problems, f"docs/claims.md, the bullet of {claim}: " + "; ".join(problems)


# --- docs/claims.md -----------------------------------------------------------------------------------------


def doc_paragraphs() -> list[str]:
    """docs/claims.md's prose paragraphs, without its generated blocks and code, nor the claim bullets and
    other measurements (checked by their own tests)."""
    text = DOC.read_text()
    text = text[: text.index(BULLETS_SECTION)] + text[text.index(AFTER) :]
    text = re.sub(r"<!-- (\w+):begin -->.*?<!-- \1:end -->", "", text, flags=re.DOTALL)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def paired_rows() -> dict[str, dict[str, tuple[float, float]]]:
    """docs/claims.md's paired table (tests/test_generated_docs.py checks it is paired.py's output)."""
    block = re.search(r"<!-- paired:begin -->\n(.*?)\n<!-- paired:end -->", DOC.read_text(), re.DOTALL).group(
        1
    )
    out = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        ends = [tuple(_value(x) for x in re.findall(rf"{NUMBER}x?", c)) for c in cells[2:4]]
        out[cells[0].strip("`")] = {"independent": ends[0], "paired": ends[1]}
    return out


WIDTH = re.compile(
    r"the (first|first two|last|last two|three) rows?'s? paired intervals? (?:is|are) (as wide as the "
    r"independent ones? or wider|wider than the independent ones?|narrower than the independent ones?)"
)

LOWER = re.compile(r"the (first|first two|last|last two|three) rows?'s? paired lower ends? (?:is|are) higher")
_ROWS = {  # the rows a statement names, of the table's rows in order
    "first": lambda rows: rows[:1],
    "first two": lambda rows: rows[:2],
    "last": lambda rows: rows[-1:],
    "last two": lambda rows: rows[-2:],
    "three": lambda rows: rows,
}


def interval_statement_problems(text: str, claims: dict[str, dict]) -> list[str]:
    """A sentence comparing the paired intervals' widths with the independent ones' must hold row by row
    against the exact independent interval (claims.json), not only its Monte Carlo repeat."""
    rows = paired_rows()
    order = list(rows)
    out = []
    for m in WIDTH.finditer(text):
        which = _ROWS[m.group(1)](order)
        for cid in which:
            lo, hi = rows[cid]["paired"]
            exact = claims[cid]["measured"]["interval"]
            ratio = (hi - lo) / (exact[1] - exact[0])
            wider = ratio >= 1
            if wider != m.group(2).startswith(("as wide", "wider")):
                out.append(
                    f"{cid}: paired [{lo}, {hi}] is {'wider' if wider else 'narrower'} than the exact "
                    f'independent [{exact[0]:.3f}, {exact[1]:.3f}], not "{m.group(2)}"'
                )
    lower = [("lower ends higher", order)] if "lower ends higher" in text else []
    lower += [(m.group(0), _ROWS[m.group(1)](order)) for m in LOWER.finditer(text)]
    for said, which in lower:
        out += [
            f'{cid}: the paired lower end {rows[cid]["paired"][0]} is not above the exact one ("{said}")'
            for cid in which
            if not rows[cid]["paired"][0] > claims[cid]["measured"]["interval"][0]
        ]
    if "narrows none of the three intervals to a decision" in text:
        out += [
            f"{cid}: the paired interval {row['paired']} excludes {claims[cid]['threshold']}"
            for cid, row in rows.items()
            if not row["paired"][0] <= claims[cid]["threshold"] <= row["paired"][1]
        ]
    return out


def test_the_checks_find_a_wrong_figure_of_each_kind():
    r = _claims()["rl-throughput-1024"]
    assert claim_problems("local SGD, D-PSGD and eager-SGD 701-703, SGP 727", r) == []
    assert len(claim_problems("local SGD, D-PSGD and eager-SGD 701-704", r)) == 1
    assert len(claim_problems("the audit put it at 0.975x scaled for that", r)) == 1
    assert claim_problems("0.91x vs SGP", r) == []
    assert len(claim_problems("WAGMA-SGD's median 661 samples/s is 5% below SGP's 727", r)) == 1  # 9%
    assert len(claim_problems("WAGMA-SGD's median 662 samples/s, AD-PSGD 691", r)) == 1
    assert len(claim_problems("(`ddppo_throughput`, 55 trials)", r)) == 1
    assert (
        len(claim_problems("one run moves by 7% with its seed", _claims()["transformer-time-to-solution"]))
        == 1
    )
    budget = _claims()["rl-final-quality"]
    assert claim_problems("WAGMA-SGD's trials trained 130 rounds in the median, up to 130", budget) == []
    assert len(claim_problems("WAGMA-SGD's trials trained 132 rounds in the median, up to 147", budget)) == 2
    assert claim_problems("the per-study bests moved by up to 0.16", budget) == []  # a value, not rounds
    statement = "the first two rows' paired intervals are narrower than the independent ones"
    wrong = interval_statement_problems(statement, _claims())
    assert len(wrong) == 1 and "transformer-time-to-solution" in wrong[0]
    assert interval_statement_problems("the last row's paired lower end is higher", _claims()) == []
    for statement, rows in (
        ("the first row's paired lower end is higher", 1),
        ("the paired ones have their lower ends higher", 2),  # the first two rows' are 0 both ways
    ):
        wrong = interval_statement_problems(statement, _claims())
        assert len(wrong) == rows and "transformer-time-to-solution" in wrong[0], statement


def budget_step_problems(text: str, claims: dict[str, dict]) -> list[str]:
    """Rounds trained, in a sentence that names no claim but a budget ("at a budget of 130 rounds"): checked
    against every fixed-budget claim (a final metric) whose folder trained that budget."""
    out = []
    for sentence in sentences(text):
        budget = re.search(r"budget of (\d+) rounds", sentence)
        if not (UP_TO.search(sentence) or MEDIAN.search(sentence)):
            continue
        assert budget, f"rounds trained, with no claim or budget named: {sentence!r}"
        for r in claims.values():
            if r["metric"] == "final_metric" and min(min(v) for v in steps(r).values()) == int(
                budget.group(1)
            ):
                out += step_problems(sentence, r)
    return out


@pytest.mark.parametrize("index", range(len(doc_paragraphs())))
def test_docs_claims_figures_are_in_their_files(index):
    claims = _claims()
    paragraph = doc_paragraphs()[index]
    named_claims = [claims[c] for c in claims if f"`{c}`" in paragraph]
    paired = [v for row in paired_rows().values() for ends in row.values() for v in ends]
    problems = [
        p
        for p in ratio_problems(paragraph, named_claims or list(claims.values()))
        if not matches(re.match(NUMBER, p).group(0), paired)
    ]
    problems += interval_statement_problems(paragraph, claims) + spread_problems(paragraph)
    problems += differ_problems(paragraph, claims)
    if named_claims:
        problems += [p for r in named_claims for p in step_problems(paragraph, r)]
    else:
        problems += budget_step_problems(paragraph, claims)
    assert not problems, f"docs/claims.md: {paragraph[:70]!r}...: " + "; ".join(problems)


# --- docs/claims.md's second look and repeatability blocks --------------------------------------------------

REPEATABILITY = ROOT / "reproduce" / "repeatability" / "results-2core-20261207"


def _doc_block(name: str) -> str:
    block = re.search(rf"<!-- {name}:begin -->\n(.*?)\n?<!-- {name}:end -->", DOC.read_text(), re.DOTALL)
    assert block, f"docs/claims.md has no <!-- {name}:begin --> ... <!-- {name}:end --> block"
    return block.group(1).rstrip("\n")


def test_docs_verdicts_block_is_the_committed_claims():
    """Per claim its verdict, fragile mark, removal counts, alternatives, ruler, hosts: as claims.json."""
    from wagma_bench.analysis.claims import verdicts_table

    assert _doc_block("verdicts") == verdicts_table(list(_claims().values())), (
        "docs/claims.md's verdicts block differs from claims.verdicts_table of reproduce/claims/claims.json"
    )


def test_docs_repeatability_block_is_what_the_committed_runs_give():
    """The committed repeatability.json is what `repeat.py summary` makes of the committed runs and tuning
    trials, and docs/claims.md's block is its rendering (the spread figures and the sentences under them)."""
    import importlib.util

    from wagma_bench.record.files import strict_json

    spec = importlib.util.spec_from_file_location(
        "repeat", ROOT / "reproduce" / "repeatability" / "repeat.py"
    )
    repeat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repeat)
    committed = json.loads((REPEATABILITY / repeat.RESULTS).read_text())
    assert json.loads(strict_json(repeat.summarize(REPEATABILITY))) == committed
    assert _doc_block("repeatability") == repeat.render(committed)

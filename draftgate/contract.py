"""The tokenizer contract, checked before anything is tokenized.

Every special token the chat template emits is resolved BY NAME from the target's tokenizer and
must be one added token that decodes to its own name, re-encodes to its own id, and splits the
text around it (so text segments can be encoded separately). Ids a user configured
(tokenizer.expected_ids) must agree: the seed run hard-coded an id for <|im_end|> that on Kimi-K2
is the ordinary token "chas" (docs/tokenizers.md has both ids). `special_ids` in the result is the only
place later stages take special ids from.

The boundary probe records (never fails on) text pairs whose pieces merge when joined:
("foo", "bar") is [7975] + [2257] apart but [50267] joined on Qwen3.

The template contract renders a built-in probe set (templates/probes.py) and a seeded generated
corpus (templates/corpus.py: contract.corpus_size conversations) with the target's
official chat template (official.py: the model directory's, or the one embedded in the default's
GGUF) and with the template as code, and records both texts per probe: any byte difference fails
the template gate (expectations/template.json), which compares the two texts itself. A covering
corpus (templates/shapes.py) holds every conversation shape the prompts stage admits, in each
serving mode; each probe carries its conversation (messages, tools) and its shape features, and the
contract (shape_coverage, from those features) and the gate (draftgate/checks/template.py, from the
conversation, never the features) both fail when a shape the code template renders was never compared.

With `contract.engine: vllm` the serving engine renders too: every probe the code template
renders is sent to vLLM's `/v1/chat/completions/render` (draftgate/engine/render.py), which
answers the prompt ids the engine would generate from, and those ids are held equal to ours (the
code template's segments encoded by our tokenizer, specials by the contract's ids). It runs here,
in the producing stage, once: the engine's answers are evidence stored in contract.json (each
probe's `engine`), like the official text; gate_template encodes each stored conversation again
itself and compares its own ids with the stored answer, without an engine (docs/engines.md,
"The template as the engine renders it").
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

# Neighbours for the isolation check: text on either side of a special token must encode as if
# the token were a hard boundary (an lstrip/rstrip or normalized added token breaks that).
ISOLATION_PROBES = (("x", "y"), (" ", " "), ("\n", "\n\n"), ("Hello world.", " The"), ("42", "0"))


class ContractError(ValueError):
    """Inputs the contract cannot even be checked with (malformed probe pairs, names)."""


@dataclass(frozen=True)
class Check:
    name: str
    id: int | None
    decodes_to: str | None
    reencodes_to: tuple[int, ...]
    single_id: bool
    is_added_token: bool
    isolates_text: bool
    expected_id: int | None
    expected_decodes_to: str | None      # what the configured id really is, when it disagrees
    reasons: tuple[str, ...]             # reason codes; empty when ok
    problem: str | None                  # every failure of this name, each with its fix

    @property
    def ok(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reencodes_to"] = list(self.reencodes_to)
        d["reasons"] = list(self.reasons)
        d["ok"] = self.ok
        return d


@dataclass(frozen=True)
class Probe:
    a: str
    b: str
    a_ids: tuple[int, ...]
    b_ids: tuple[int, ...]
    joined_ids: tuple[int, ...]

    @property
    def merges(self) -> bool:
        return self.a_ids + self.b_ids != self.joined_ids

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "a_ids": list(self.a_ids), "b_ids": list(self.b_ids),
                "joined_ids": list(self.joined_ids), "merges": self.merges}


@dataclass(frozen=True)
class TemplateProbe:
    probe: str
    thinking: bool
    # compared | code_refuses | official_refuses | no_official
    status: str
    official_text: str | None
    code_text: str | None
    first_diff: int | None               # character offset of the first difference, when any
    diff_context: str | None             # the official and code text around it
    detail: str | None                   # why a side did not render
    # The conversation itself, as the prompts stage stores one (schema.compact_json: JSON text,
    # key order kept, since a template renders tools in their order): gate_template reads its
    # shape features again from these (draftgate/checks/template.py), never from `features`.
    messages: str
    tools: str | None
    features: tuple[str, ...] = ()       # its shape features (templates/shapes.py), the stage's own label
    engine: EngineRender | None = None   # contract.engine vllm, for a probe the code template renders

    @property
    def text_ok(self) -> bool:
        # official_refuses: the code renders a conversation the model's own template cannot, so
        # it invents a format. code_refuses is fine: such prompts are rejected before generation.
        if self.status == "official_refuses":
            return False
        return self.status != "compared" or self.official_text == self.code_text

    @property
    def ok(self) -> bool:
        return self.text_ok and (self.engine is None or self.engine.ok)

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "features": list(self.features), "ok": self.ok}
        engine = d.pop("engine")
        # Without an engine the probe's record is as it always was (contract.json's bytes unchanged).
        return d if engine is None else {**d, "engine": self.engine.to_dict()}


@dataclass(frozen=True)
class EngineRender:
    """The serving engine's prompt ids for one probe, against ours (`contract.engine: vllm`).

    status: equal; special_text (ours equal the engine's once the text segments are encoded with
    added tokens parsed: the conversation's text spells a special token, which the engine turns
    into that token while draftgate keeps text as text, docs/tokenizers.md); differs;
    engine_refuses (it answered 400: the code template renders what the served one cannot)."""
    status: str
    ids: tuple[int, ...] | None          # the engine's answer as received
    first_diff: int | None               # token position of the first difference, when any
    diff_context: str | None             # the ids around it and their text, engine | ours
    detail: str | None                   # the engine's refusal

    @property
    def ok(self) -> bool:
        return self.status in ("equal", "special_text")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ids": None if self.ids is None else list(self.ids), "ok": self.ok}


@dataclass(frozen=True)
class FeatureCoverage:
    """One shape feature in one serving mode, counted over the probes (templates/shapes.py says
    how): held by `held` conversations, `rendered` of them by the code template, `compared` of
    those by the official template too."""
    feature: str
    family: str
    thinking: bool
    held: int
    rendered: int
    compared: int

    @property
    def status(self) -> str:
        # never_held: the corpus lacks the shape. refused: the code template renders no
        # conversation holding it, so the prompts stage rejects it too (template_unsupported).
        # uncovered: the prompts stage admits it, the official template never rendered it.
        if not self.held:
            return "never_held"
        if not self.rendered:
            return "refused"
        return "compared" if self.compared else "uncovered"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


@dataclass(frozen=True)
class TemplateContract:
    template: str
    official: dict[str, Any] | None      # source, sha256, hooks_sha256; None: none ships
    probes: tuple[TemplateProbe, ...]
    engine: dict[str, Any] | None = None  # the rendering engine's identity (contract.engine vllm)

    @property
    def compared(self) -> int:
        return sum(p.status == "compared" for p in self.probes)

    @property
    def coverage(self) -> tuple[FeatureCoverage, ...]:
        return shape_coverage(self.probes)

    def gaps(self) -> list[FeatureCoverage]:
        """Features the probes never held, and admitted ones never compared (with no official
        template nothing is compared: gates.template.min_compared decides that case)."""
        bad = {"never_held"} | ({"uncovered"} if self.official is not None else set())
        return [c for c in self.coverage if c.status in bad]

    @property
    def ok(self) -> bool:
        """Every probe renders alike (or only the code refuses it). On a partial probe set this
        says nothing about shapes: `complete` does."""
        return all(p.ok for p in self.probes)

    @property
    def complete(self) -> bool:
        return not self.gaps()

    def engine_counts(self) -> dict[str, int]:
        asked = [p.engine.status for p in self.probes if p.engine is not None]
        return {"asked": len(asked), **{s: asked.count(s) for s in ENGINE_STATUSES}}

    def to_dict(self) -> dict[str, Any]:
        cov = self.coverage
        engine = {} if self.engine is None else {"engine": self.engine, "engine_counts": self.engine_counts()}
        return {"template": self.template, "official": self.official, "compared": self.compared,
                "differ": sum(not p.ok for p in self.probes),
                "features": {s: sum(c.status == s for c in cov) for s in ("compared", "refused", "uncovered",
                                                                          "never_held")},
                "ok": self.ok, "complete": self.complete, **engine}

    def document(self) -> dict[str, Any]:
        """What gate_template reads (contract.json): the probes with their renders and conversations
        (the gate finds their shape features itself), and, for readers, the stage's own labels, the
        shape catalogue and the contract's own count."""
        from draftgate.templates.shapes import FEATURES

        return {"template_probes": [p.to_dict() for p in self.probes],
                "template_shape_features": [{"feature": f, "family": g} for f, g in FEATURES],
                "template_coverage": [c.to_dict() for c in self.coverage]}


def shape_coverage(probes: Sequence[TemplateProbe]) -> tuple[FeatureCoverage, ...]:
    from draftgate.templates.shapes import FEATURES, MODES

    out = []
    for thinking in MODES:
        mode = [p for p in probes if p.thinking == thinking]
        for feature, family in FEATURES:
            held = [p for p in mode if feature in p.features]
            rendered = [p for p in held if p.code_text is not None]
            out.append(FeatureCoverage(feature, family, thinking, len(held), len(rendered),
                                       sum(p.official_text is not None for p in rendered)))
    return tuple(out)


@dataclass(frozen=True)
class ContractResult:
    tokenizer: dict[str, Any]            # kind, name, fingerprint, vocab_size
    template: str | None
    checks: tuple[Check, ...]
    boundary_probe: tuple[Probe, ...]
    template_contract: TemplateContract | None = None
    # The roles of the verified ids (end, think, tool markers, ...): what gates recompute with.
    roles: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def special_ids(self) -> dict[str, int]:
        # Verified ids only: a name that failed any check never reaches reconstruction.
        return {c.name: c.id for c in self.checks if c.ok}

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        tc = self.template_contract
        return {"tokenizer": self.tokenizer, "template": self.template,
                "special_ids": self.special_ids, "roles": self.roles,
                "checks": [c.to_dict() for c in self.checks],
                "boundary_probe": [p.to_dict() for p in self.boundary_probe], "ok": self.ok,
                "template_contract": tc.to_dict() if tc else None,
                **(tc.document() if tc else {"template_probes": []})}


def check_contract(tok: Any, special_names: Iterable[str], expected_ids: Mapping[str, int],
                   probe_pairs: Sequence[Sequence[str]], *, template: str | None = None) -> ContractResult:
    names = sorted(set(special_names) | set(expected_ids))
    if not names:
        raise ContractError("no special-token names to check: the template declares none and "
                            "tokenizer.expected_ids is empty")
    checks = tuple(_check_name(tok, n, expected_ids.get(n), template) for n in names)
    info = {"kind": tok.kind, "name": tok.name, "fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size}
    return ContractResult(info, template, checks, boundary_probe(tok, probe_pairs))


def check_template(template: Any, official: Any, probes: Sequence[Any]) -> TemplateContract:
    """Render every probe with the official template and with the template as code."""
    from draftgate.official import OfficialTemplateError
    from draftgate.schema import compact_json
    from draftgate.templates.base import TemplateError, render_text
    from draftgate.templates.shapes import shape_features

    out = []
    for p in probes:
        code = official_text = detail = None
        try:
            code = render_text(template.render_prompt(p.messages, p.tools, p.thinking))
        except TemplateError as e:
            detail = f"the code template refuses it: {e}"
        if official is not None:
            try:
                official_text = official.render(p.messages, p.tools, template.jinja_kwargs(p.thinking))
            except OfficialTemplateError as e:
                detail = f"{detail}; {e}" if detail else str(e)
        if official is None:
            status, detail = "no_official", "the tokenizer ships no chat template to compare with"
        elif code is None:
            status = "code_refuses"
        elif official_text is None:
            # The code template renders what the official one cannot: it invents a format.
            status = "official_refuses"
        else:
            status = "compared"
        diff = context = None
        if status == "compared" and code != official_text:
            diff = next((i for i, (a, b) in enumerate(zip(official_text, code)) if a != b),
                        min(len(official_text), len(code)))
            lo = max(0, diff - 30)
            context = f"official {official_text[lo:diff + 40]!r} | code {code[lo:diff + 40]!r}"
        out.append(TemplateProbe(p.name, p.thinking, status, official_text, code, diff, context, detail,
                                 compact_json(p.messages), None if p.tools is None else compact_json(p.tools),
                                 shape_features(p.messages, p.tools)))
    return TemplateContract(template.name, official.to_dict() if official is not None else None, tuple(out))


ENGINE_STATUSES = ("equal", "special_text", "differs", "engine_refuses")


def engine_rendering(tc: TemplateContract, probes: Sequence[Any], template: Any, tok: Any,
                     special_ids: Mapping[str, int], params: Any) -> TemplateContract:
    """`tc` with the serving engine's prompt ids for every probe the code template rendered
    (`probes` in tc's order), each compared with ours. Raises ContractError when the engine
    cannot be asked (not installed, a server without the render endpoint: the message says the fix)."""
    from dataclasses import replace

    from draftgate.engine.launch import EngineError
    from draftgate.engine.render import render_all, rendering_engine
    from draftgate.templates import MissingSpecialError, encode_segments

    asked = [i for i, p in enumerate(tc.probes) if p.code_text is not None]
    segments = [template.render_prompt(probes[i].messages, probes[i].tools, probes[i].thinking) for i in asked]
    try:
        ours = encode_segments(tok, segments, special_ids)
        # A serving engine encodes the rendered text whole: a special token's name inside a message
        # becomes that token (tokenizers/base.py encode_batch). Ours keeps text as text.
        parsed = encode_segments(_AddedTokensParsed(tok), segments, special_ids)
    except MissingSpecialError as e:
        raise ContractError(f"contract.engine vllm: {e}; the special-token contract must pass first") from None
    try:
        with rendering_engine(params) as server:
            answers = render_all(server, [(probes[i].messages, probes[i].tools, template.jinja_kwargs(probes[i].thinking))
                                          for i in asked])
    except EngineError as e:
        raise ContractError(f"contract.engine vllm: {e}") from None
    out = list(tc.probes)
    for i, answer, mine, mine_parsed in zip(asked, answers, ours, parsed):
        out[i] = replace(out[i], engine=compare_ids(answer.ids, mine, mine_parsed, answer.detail, tok))
    return replace(tc, probes=tuple(out), engine=server.identity)


class _AddedTokensParsed:
    def __init__(self, tok: Any):
        self.encode_ordinary_batch = tok.encode_batch


def compare_ids(engine: Sequence[int] | None, ours: list[int], ours_parsed: list[int], detail: str | None,
                tok: Any) -> EngineRender:
    if engine is None:
        return EngineRender("engine_refuses", None, None, None, detail)
    engine = tuple(engine)
    if engine == tuple(ours):
        return EngineRender("equal", engine, None, None, None)
    k = next((i for i, (a, b) in enumerate(zip(engine, ours)) if a != b), min(len(engine), len(ours)))
    lo = max(0, k - 4)

    def around(ids: Sequence[int]) -> str:
        return f"{list(ids[lo:k + 4])} {tok.decode(ids[lo:k])!r}⟦{tok.decode(ids[k:k + 1])!r}⟧{tok.decode(ids[k + 1:k + 4])!r}"

    status = "special_text" if engine == tuple(ours_parsed) else "differs"
    return EngineRender(status, engine, k, f"engine {around(engine)} | ours {around(ours)}", None)


def vocab_table(tok: Any) -> Any:
    """Every id's bytes (hex), so gates can decode ids without loading the tokenizer: a second
    opinion on whether two id sequences spell the same text."""
    import pyarrow as pa

    ids = range(tok.vocab_size)
    return pa.table({"id": pa.array(ids, pa.int32()),
                     "hex": pa.array([tok.token_bytes(i).hex() for i in ids], pa.string()),
                     "added": pa.array([tok.is_added(i) for i in ids], pa.bool_())})


def boundary_probe(tok: Any, pairs: Sequence[Sequence[str]]) -> tuple[Probe, ...]:
    for i, p in enumerate(pairs):
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(s, str) for s in p)):
            raise ContractError(f"contract.probe_pairs[{i}] must be a pair of strings [a, b], got {p!r}")
    if not pairs:
        return ()
    ids = tok.encode_ordinary_batch([s for a, b in pairs for s in (a, b, a + b)])
    return tuple(Probe(a, b, tuple(ids[3 * i]), tuple(ids[3 * i + 1]), tuple(ids[3 * i + 2]))
                 for i, (a, b) in enumerate(pairs))


def _check_name(tok: Any, name: str, expected: int | None, template: str | None) -> Check:
    tid = tok.token_id(name)
    expected_text = _describe(tok, expected) if expected is not None and expected != tid else None
    problems: list[tuple[str, str]] = []
    if tid is None:
        problems.append(("not_in_vocabulary",
                         f"{name!r} is not a token of {tok.name}, but template {template} emits it: "
                         "is tokenizer.kind/path the target model's own tokenizer?"))
        decoded, reencoded, single, added, isolates = None, (), False, False, False
    else:
        decoded = tok.decode([tid])
        reencoded = tuple(tok.encode(name))
        single = reencoded == (tid,)
        added = tok.is_added(tid)
        isolates = all(tok.encode(a + name + b) == tok.encode_ordinary(a) + [tid] + tok.encode_ordinary(b)
                       for a, b in ISOLATION_PROBES)
        if decoded != name:
            problems.append(("decode_mismatch", f"decode([{tid}]) is {decoded!r}, not {name!r}"))
        if not single:
            problems.append(("not_single_id",
                             f"encode({name!r}) is {list(reencoded)}, not [{tid}]: the text would not "
                             "come back as this token"))
        if not added:
            problems.append(("not_added_token",
                             f"{name!r} (id {tid}) is an ordinary vocabulary piece, not an added token: "
                             "BPE produces it from plain text; fix the template's special names"))
        if added and not isolates:
            problems.append(("text_not_isolated",
                             f"text next to {name!r} does not split cleanly at it (an lstrip/rstrip or "
                             "normalized added token?): encoding segments separately would be wrong"))
    if expected is not None and expected != tid:
        have = f"has {name!r} = {tid}" if tid is not None else f"has no {name!r}"
        problems.append(("expected_id_mismatch",
                         f"tokenizer.expected_ids says {name!r} = {expected}, but {tok.name} {have}; "
                         f"id {expected} is {expected_text}. Fix: set tokenizer.expected_ids.{name} "
                         f"to {tid} or remove it (ids come from this contract, never from constants)"))
    return Check(name=name, id=tid, decodes_to=decoded, reencodes_to=reencoded, single_id=single,
                 is_added_token=added, isolates_text=isolates, expected_id=expected,
                 expected_decodes_to=expected_text,
                 reasons=tuple(code for code, _ in problems),
                 problem="; ".join(text for _, text in problems) or None)


def _describe(tok: Any, token_id: int) -> str:
    if not 0 <= token_id < tok.vocab_size:
        return f"outside the vocabulary (0..{tok.vocab_size - 1})"
    kind = "an added token" if tok.is_added(token_id) else "an ordinary token"
    return f"{tok.decode([token_id])!r} ({kind})"


# ---------------------------------------------------------------- the stage's work

def template_special_names(template: str) -> frozenset[str]:
    from draftgate.templates import get_template

    return frozenset(get_template(template).special_names)


@dataclass(frozen=True)
class ContractRun:
    """The contract stage's work: the result (contract.json), the tokenizer it was checked on (its
    byte table is the gates' vocab.parquet: vocab_table) and the stage's metrics, unwritten."""
    result: ContractResult
    tok: Any
    metrics: Any                          # draftgate.metrics.StageMetrics


def run(params: Any) -> ContractRun:
    """Check the special-token and template contracts of `params` (tokenizer, template, contract).
    Raises TokenizerError, TemplateError or ContractError when they cannot even be checked."""
    from dataclasses import replace

    from draftgate.config import as_dict
    from draftgate.metrics import StageMetrics
    from draftgate.official import official_template
    from draftgate.templates import get_template
    from draftgate.templates.corpus import generated_corpus
    from draftgate.templates.probes import PROBES
    from draftgate.templates.roles import template_roles
    from draftgate.templates.shapes import covering_corpus
    from draftgate.tokenizers import load_tokenizer

    tok = load_tokenizer(params.tokenizer)
    template = get_template(params.template.name)
    result = check_contract(tok, template.special_names, params.tokenizer.expected_ids,
                            params.contract.probe_pairs, template=params.template.name)
    official = official_template(tok, params.tokenizer.kind, params.tokenizer.path)
    corpus = generated_corpus(params.contract.corpus_seed, params.contract.corpus_size)
    shapes = covering_corpus()
    probes = PROBES + corpus + shapes
    tc = check_template(template, official, probes)
    if params.contract.engine == "vllm":
        tc = engine_rendering(tc, probes, template, tok, result.special_ids, params)
    result = replace(result, template_contract=tc, roles=template_roles(template, result.special_ids))
    m = StageMetrics("contract", rows_in=len(result.checks), rows_out=len(result.checks) - len(result.failures()))
    for c in result.failures():
        for r in c.reasons:
            m.drop(r)
    tc = result.template_contract
    for p in tc.probes:
        if not p.text_ok:
            m.drop("template_differs")
    gaps = tc.gaps()
    for g in gaps:
        m.drop(f"template_shape_{g.status}")
    random_part = tc.probes[len(PROBES):len(PROBES) + len(corpus)]
    m.figures.update(ok=result.ok, tokenizer=result.tokenizer, template=result.template,
                     special_ids=result.special_ids,
                     boundary_merges=sum(p.merges for p in result.boundary_probe),
                     template_contract=tc.to_dict(),
                     # The fixed probes and the generated corpus apart: a near-miss template
                     # passes the first and fails the second (docs/templates.md).
                     template_corpus={"seed": params.contract.corpus_seed, "size": len(corpus),
                                      "compared": sum(p.status == "compared" for p in random_part),
                                      "differ": sum(not p.ok for p in random_part)},
                     # The covering corpus (templates/shapes.py) and every (feature, mode) the
                     # probes left uncompared though the prompts stage admits it.
                     template_shapes={"size": len(shapes), "gaps": [_feature_key(g) for g in gaps]})
    if tc.engine is not None:
        m.figures["template_engine"] = {**tc.engine, "counts": tc.engine_counts()}
        for p in tc.probes:
            if p.engine is not None and not p.engine.ok:
                m.drop(f"template_engine_{p.engine.status}")
    m.params = {k: as_dict(getattr(params, k)) for k in ("tokenizer", "template", "contract")}
    return ContractRun(result, tok, m)


def summary(result: ContractResult, out: Any) -> tuple[list[str], list[str]]:
    """(what to print, each failure with its fix for stderr)."""
    t, tc = result.tokenizer, result.template_contract
    official = tc.official["source"] if tc.official else "no official template"
    lines = [f"contract: {t['name']} ({t['kind']}, vocab {t['vocab_size']}, {t['fingerprint'][:12]}) x "
             f"template {result.template}: {len(result.checks)} special tokens, "
             f"{len(result.failures())} failed -> {out}",
             f"contract: template {tc.template} vs {official}: {tc.compared} probes compared, "
             f"{sum(not p.ok for p in tc.probes)} differ; shape features compared "
             f"{sum(c.status == 'compared' for c in tc.coverage)}, refused {sum(c.status == 'refused' for c in tc.coverage)}, "
             f"gaps {len(tc.gaps())}"]
    if tc.engine is not None:
        n = tc.engine_counts()
        lines.append(f"contract: template {tc.template} vs vLLM {tc.engine.get('version')} ({tc.engine.get('model')}): "
                     f"{n['asked']} probes rendered as ids by the engine, {n['equal']} equal, "
                     f"{n['special_text']} equal once special-token text is parsed as the engine parses it, "
                     f"{n['differs']} differ, {n['engine_refuses']} refused")
    fails = [f"  FAIL {c.name!r} [{', '.join(c.reasons)}]: {c.problem}" for c in result.failures()]
    fails += [f"  FAIL template probe {p.probe!r} at char {p.first_diff}: {p.diff_context}"
              for p in tc.probes if not p.text_ok]
    fails += [f"  FAIL template probe {p.probe!r} (thinking {'on' if p.thinking else 'off'}) through the engine: "
              + (f"its prompt ids and ours differ from token {p.engine.first_diff}: {p.engine.diff_context}"
                 if p.engine.status == "differs" else f"the engine refuses it ({p.engine.detail})")
              for p in tc.probes if p.engine is not None and not p.engine.ok]
    fails += [f"  FAIL shape {_feature_key(g)}: {_GAP_FIX[g.status]}" for g in tc.gaps()]
    return lines, fails


def _feature_key(c: FeatureCoverage) -> str:
    return f"{c.feature} (thinking {'on' if c.thinking else 'off'})"


_GAP_FIX = {
    "never_held": "no probe holds it; add a conversation with it to templates/shapes.py covering_corpus",
    "uncovered": "the prompts stage admits it but the official template never rendered it; make the code "
                 "template refuse it (the prompts stage then rejects it) or fix the official render",
}


# ---------------------------------------------------------------- `draftgate contract` (ad hoc)

def main(argv: list[str] | None = None) -> int:
    """Check the contract of a params file by hand; the pipeline's stage is stages/contract.py."""
    p = argparse.ArgumentParser(prog="draftgate contract", description=(
        "Resolve every special token of the template by name and verify it, and the template against the "
        "official one; exit 1 when either fails."))
    p.add_argument("--params", default="params.yaml", help="params file (tokenizer, template, contract)")
    p.add_argument("--out", help="also write the contract JSON here")
    args = p.parse_args(argv)
    from draftgate.config import ParamsError, load_params
    from draftgate.io import write_json
    from draftgate.templates.base import TemplateError
    from draftgate.tokenizers import TokenizerError

    try:
        done = run(load_params(args.params))
    except (ParamsError, TokenizerError, TemplateError, ContractError) as e:
        print(f"contract: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_json(args.out, done.result.to_dict())
    lines, fails = summary(done.result, args.out or "(not written)")
    print("\n".join(lines))
    for line in fails:
        print(line, file=sys.stderr)
    tc = done.result.template_contract
    return 0 if done.result.ok and tc.ok and tc.complete else 1

"""The hint types: parsing, validation errors that name the field, and agreement with the agent's
OpenAPI document (docs/openapi.json), which the agent's own tests keep in step with its router."""

import json
import pathlib

import pytest

import ringside.hints
from ringside import Algorithm, Codec, CodecFamily, Constraints, Hint, HintError
from scripted_agent import make_hint

OPENAPI = pathlib.Path(__file__).resolve().parents[3] / "docs" / "openapi.json"


def test_codec_strings_round_trip_like_the_rust_types():
    for text in ["none", "fp16", "bf16", "int8", "topk:0.25", "topk:0.1", "topk:1"]:
        assert str(Codec.parse(text)) == text
    assert Codec.parse("topk:1.0") == Codec(CodecFamily.TOPK, 1.0)
    assert str(Codec.parse("topk:1.0")) == "topk:1"  # as Rust's f32 Display prints it
    assert Codec.parse("int8").wire_bytes_per_f32 == 1.0
    assert Codec.parse("topk:0.25").wire_bytes_per_f32 == 2.0
    assert [f.lossiness for f in CodecFamily] == [0, 1, 2, 3, 4]
    for bad in ["topk:0", "topk:1.5", "topk:nan", "topk:", "topk", "zstd", "", "INT8"]:
        with pytest.raises(HintError) as e:
            Codec.parse(bad)
        assert "use none, fp16" in str(e.value) or "topk:RATIO" in str(e.value), bad
    with pytest.raises(HintError):
        Codec(CodecFamily.INT8, 0.5)  # only top-k has a ratio


def test_a_served_hint_parses_into_typed_fields():
    raw = make_hint("j-1", 3, "topk:0.1", step_from=40, algorithm="tree", channels=2)
    h = Hint.from_json(json.dumps(raw))
    assert (h.version, h.step_from, h.algorithm, h.channels) == (3, 40, Algorithm.TREE, 2)
    assert h.compression == Codec(CodecFamily.TOPK, 0.1)
    assert h.reasons == ("path to peer 10.0.0.3 lossy",)
    assert h.to_json() == raw
    assert Hint.from_json(h.to_json()) == h
    assert not h.expired()
    assert h.expired(now_unix_ms=h.expires_at + 1)
    with pytest.raises(Exception):
        h.version = 4  # frozen


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("channels", 0, "hint.channels: 0 is not valid"),
        ("channels", 256, "hint.channels"),
        ("version", 0, "hint.version"),
        ("version", True, "hint.version"),  # a JSON bool is not a number
        ("step_from", -1, "hint.step_from"),
        ("step_from", 1.0, "hint.step_from"),  # serde refuses 1.0 for a u64; so do we
        ("chunk_bytes", 1 << 32, "hint.chunk_bytes"),
        ("algorithm", "butterfly", "hint.algorithm: 'butterfly' is not valid: use ring, tree or rhd"),
        ("compression", "topk:2", "hint.compression: 'topk:2'"),
        ("error_feedback", "yes", "hint.error_feedback"),
        ("reasons", "lossy", "hint.reasons"),
        ("confidence", 1.5, "hint.confidence"),
        ("job", "", "hint.job"),
    ],
)
def test_a_bad_field_is_named_in_the_error(field, value, needle):
    raw = make_hint("j-1", 2, "int8")
    raw[field] = value
    with pytest.raises(HintError) as e:
        Hint.from_json(raw)
    assert needle in str(e.value)
    assert e.value.field == f"hint.{field}"


def test_transport_advice_is_optional_and_checked():
    plain = make_hint("j-1", 2, "int8")
    assert Hint.from_json(plain).tcp_rto_min_ms is None
    assert Hint.from_json({**plain, "tcp_rto_min_ms": None}).tcp_rto_min_ms is None
    h = Hint.from_json({**plain, "tcp_rto_min_ms": 5})
    assert h.tcp_rto_min_ms == 5 and h.to_json()["tcp_rto_min_ms"] == 5
    assert "tcp_rto_min_ms" not in Hint.from_json(plain).to_json(), "absent stays absent, as the agent sends it"
    for bad in [0, 201, True, 5.0, "5"]:
        with pytest.raises(HintError) as e:
            Hint.from_json({**plain, "tcp_rto_min_ms": bad})
        assert e.value.field == "hint.tcp_rto_min_ms", bad
    # The plan of a hint with advice keeps constraints without transport_tuning: the advice is
    # apart (a follower drops it alone).
    assert Constraints().why_not(h) is None


def test_missing_fields_unknown_fields_and_non_objects():
    raw = make_hint("j-1", 2)
    del raw["expires_at"]
    with pytest.raises(HintError, match=r"hint\.expires_at: .*missing"):
        Hint.from_json(raw)
    # A newer agent may add fields: ignored, as the Rust client ignores them.
    assert Hint.from_json({**make_hint("j-1", 2), "new_field": 1}).version == 2
    with pytest.raises(HintError, match="not JSON"):
        Hint.from_json("{not json")
    with pytest.raises(HintError, match="expected a JSON object"):
        Hint.from_json("[1, 2]")


def test_constraints_defaults_and_checks_match_the_agent():
    c = Constraints()
    assert c.to_json() == {
        "algorithms": ["ring", "tree", "rhd"],
        "codecs": ["none", "fp16", "bf16", "int8", "topk"],
        "min_topk_ratio": 0.1,
        "max_channels": 1,
        "error_feedback": True,
        "step_time_target_ms": None,
        "transport_tuning": False,
    }
    assert Constraints.from_json('{"transport_tuning": true}').transport_tuning
    with pytest.raises(HintError, match=r"constraints\.transport_tuning"):
        Constraints(transport_tuning="yes")
    c = Constraints.from_json('{"codecs": ["fp16", "int8", "topk"], "min_topk_ratio": 0.1}')
    assert c.allows_codec(Codec.parse("none")) and c.allows_codec(Codec.parse("int8"))
    assert not c.allows_codec(Codec.parse("bf16"))
    assert c.allows_codec(Codec.parse("topk:0.1")) and not c.allows_codec(Codec.parse("topk:0.05"))
    with pytest.raises(HintError, match=r"constraints\.constrains: .*unknown field"):
        Constraints.from_json('{"constrains": {}}')
    with pytest.raises(HintError, match=r"constraints\.max_channels"):
        Constraints(max_channels=0)
    with pytest.raises(HintError, match=r"constraints\.codecs: 'zstd'"):
        Constraints(codecs=("zstd",))
    h = Hint.from_json(make_hint("j-1", 2, "topk:0.05"))
    assert "min_topk_ratio" in c.why_not(h)
    assert "not among the allowed codecs" in Constraints(codecs=("none",)).why_not(Hint.from_json(make_hint("j-1", 2, "int8")))
    assert "error feedback" in Constraints(error_feedback=False).why_not(Hint.from_json(make_hint("j-1", 2, "int8")))
    assert Constraints().why_not(Hint.from_json(make_hint("j-1", 2, "int8"))) is None


def test_the_types_agree_with_the_agents_openapi_document():
    if not OPENAPI.is_file():
        pytest.fail(f"{OPENAPI} is missing: run the tests from the ringside repository (the package's tests check it against the agent's API)")
    schemas = json.loads(OPENAPI.read_text())["components"]["schemas"]
    hint = schemas["Hint"]
    optional = {"tcp_rto_min_ms"}
    assert sorted(hint["required"]) == sorted(set(Hint.__dataclass_fields__) - optional)
    assert sorted(hint["properties"]) == sorted(Hint.__dataclass_fields__)
    assert hint["properties"]["tcp_rto_min_ms"]["maximum"] == ringside.hints.MAX_RTO_MIN_MS
    assert hint["properties"]["algorithm"]["enum"] == [a.value for a in Algorithm]
    assert sorted(schemas["Constraints"]["properties"]) == sorted(Constraints.__dataclass_fields__)

import dataclasses

import pytest

from keras_transformer import TransformerConfig


def test_base_and_big_presets_match_table_3():
    base = TransformerConfig.preset("base")
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads) == (6, 512, 2048, 8)
    assert (base.key_dim, base.value_dim) == (64, 64)
    assert (base.dropout, base.label_smoothing, base.warmup_steps) == (0.1, 0.1, 4000)
    assert base.share_embeddings and base.tie_output_embeddings
    assert base.position_embedding == "sinusoidal" and not base.norm_first
    big = TransformerConfig.preset("big")
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads) == (6, 1024, 4096, 16)
    assert (big.key_dim, big.value_dim, big.dropout) == (64, 64, 0.3)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # Table 3 row (A): heads and per-head dims vary, d_model fixed.
        (dict(num_heads=1, key_dim=512, value_dim=512), (1, 512, 512)),
        (dict(num_heads=4, key_dim=128, value_dim=128), (4, 128, 128)),
        (dict(num_heads=16, key_dim=32, value_dim=32), (16, 32, 32)),
        (dict(num_heads=32, key_dim=16, value_dim=16), (32, 16, 16)),
        # row (B): smaller d_k only.
        (dict(key_dim=16), (8, 16, 16)),
    ],
)
def test_table_3_rows_are_expressible(overrides, expected):
    config = TransformerConfig.preset("base", **overrides)
    assert (config.num_heads, config.key_dim, config.value_dim) == expected


def test_table_3_rows_c_d_e():
    assert TransformerConfig.preset("base", num_layers=2).num_layers == 2
    assert TransformerConfig.preset("base", d_model=256, key_dim=32).d_model == 256
    assert TransformerConfig.preset("base", dropout=0.0, label_smoothing=0.2).label_smoothing == 0.2
    assert TransformerConfig.preset("base", position_embedding="learned").position_embedding == "learned"


def test_bad_values_name_the_problem():
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        TransformerConfig.preset("huge")
    with pytest.raises(ValueError, match="num_hedas"):
        TransformerConfig.preset("base", num_hedas=4)
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(d_model=100, num_heads=8)
    with pytest.raises(ValueError, match="dropout"):
        TransformerConfig(dropout=1.5)
    with pytest.raises(ValueError, match="position_embedding"):
        TransformerConfig(position_embedding="rotary")
    with pytest.raises(ValueError, match="pad_id must be 0"):
        TransformerConfig(pad_id=5)
    with pytest.raises(ValueError, match="distinct"):
        TransformerConfig(bos_id=2, eos_id=2)


def test_config_is_frozen_and_round_trips():
    config = TransformerConfig.preset("small")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 3
    assert TransformerConfig.from_dict(config.to_dict()) == config
    wider = config.replace(d_model=512)
    assert (wider.d_model, wider.key_dim) == (512, 128)

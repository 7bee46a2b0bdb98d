"""SGLang's dist port and HTTP port each pull in more ports; the two sets must not meet.

Ports SGLang derives (sgl-project/sglang:python/sglang/srt/server_args.py, PortArgs.init_new):
D+1..D+5 and D+6+rank from --dist-init-addr's port D; P+100..P+1000 (NCCL) and P+233 from the
HTTP port P.
"""

from __future__ import annotations

import pytest

from slurmfm.errors import RecipeError
from slurmfm.job import hosts as hs
from slurmfm.recipe.loader import parse_yaml, validate


def test_dist_ports_that_reach_the_http_band_clash() -> None:
    assert hs.sglang_port_clash(30000, 30000)  # the dist range 26000-31999 holds 30000
    assert hs.sglang_port_clash(29995, 30000)  # 29995+6 reaches 30000
    assert hs.sglang_port_clash(30500, 30000)  # inside SGLang's NCCL port band
    assert hs.sglang_port_clash(29000, 30000) is None
    assert hs.sglang_port_clash(31100, 30000) is None
    assert hs.sglang_port_clash(29990, 30000, dp=8)  # 8 DP-attention ranks reach 30000
    assert hs.sglang_port_clash(26000, 30000, taken=(26003,))  # the rendezvous port
    assert hs.sglang_port_clash(32764, 20000, ephemeral=(32768, 60999))


def test_the_runtime_picks_dist_ports_clear_of_the_http_port() -> None:
    """Every job id's pick in the default range (26000-31999) keeps clear of port 30000."""

    def clash(p: int) -> bool:
        return hs.sglang_port_clash(p, 30000, 1, (), (32768, 60999)) is not None

    picks = {
        hs.choose_port(
            job, 0, 26000, 6000, (32768, 60999), lambda p: True, usable=lambda p: not clash(p)
        )
        for job in range(0, 6000, 7)
    }
    assert picks
    assert not any(clash(p) for p in picks)
    # without the check, some job ids would have drawn a clashing port
    raw = {
        hs.choose_port(job, 0, 26000, 6000, (32768, 60999), lambda p: True) for job in range(6000)
    }
    assert any(clash(p) for p in raw)


RECIPE = """\
name: sg
cluster: {{instance_type: p6-b200.48xlarge, partition: gpu}}
resources: {{nodes: 2}}
parallelism: {{tp: 16}}
launcher:
  kind: sglang
  model: deepseek-ai/DeepSeek-V3
  dist_port: {dist}
  extra_args: [{extra}]
"""


def load_recipe_text(text: str, source: str) -> object:
    data, lines = parse_yaml(text, source)
    return validate(data, source=source, lines=lines)


def test_a_recipe_dist_port_next_to_the_http_port_is_refused() -> None:
    with pytest.raises(RecipeError, match="dist_port 30002"):
        load_recipe_text(RECIPE.format(dist=30002, extra=""), "r.yaml")
    with pytest.raises(RecipeError, match="dist_port 29990"):
        load_recipe_text(RECIPE.format(dist=29990, extra="--dp-size, '8'"), "r.yaml")
    assert load_recipe_text(RECIPE.format(dist=29990, extra=""), "r.yaml") is not None

# SPDX-License-Identifier: Apache-2.0
"""A deliberately plain implementation of DeepSpec's drafter forward, written from
shared/reference/deepspec-checkpoint.md (§3, §4) only: explicit loops over rows, heads and slots, no cache (the
whole context is re-encoded every call), float64 RoPE angles, nothing imported from dspark.models.

It is the oracle of tests/models/test_drafter_golden.py.
"""

from __future__ import annotations

import math

import torch

from dspark.reference.philox import philox_draw_ref  # the foundation's pure-Python Philox (not the drafter)


def _rmsnorm(vec, weight, eps):
    var = float((vec.double() ** 2).mean())
    return weight * (vec / math.sqrt(var + eps))


def _rope(vec, pos, theta):
    d = vec.shape[0]
    half = d // 2
    out = vec.clone()
    for i in range(half):
        ang = pos * theta ** (-(2.0 * i) / d)
        a, b = float(vec[i]), float(vec[i + half])
        out[i] = a * math.cos(ang) - b * math.sin(ang)
        out[i + half] = b * math.cos(ang) + a * math.sin(ang)
    return out


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def plain_draft(w, cfg, features, first_pos, anchor, temperature=0.0, seed=0, offset=0, request=0):
    """DeepSpec's draft of one request.

    w : dict name -> float32 tensor (the checkpoint); cfg : the config.json dict;
    features : [n, m*H] all committed context rows (positions first_pos .. first_pos + n - 1);
    anchor : int, at position first_pos + n.
    Returns dict with hidden [g, H], base [g, V], z [g, V], tokens [g], conf_logit/conf/survival [g] (or None).
    """
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg["rope_theta"]
    g = cfg["block_size"]
    mask = cfg["mask_token_id"]
    n_ctx = features.shape[0]
    start = first_pos + n_ctx

    # §3.2 fusion, one row at a time
    ctx = []
    for p in range(n_ctx):
        row = torch.mv(w["fc.weight"], features[p])
        ctx.append(_rmsnorm(row, w["hidden_norm.weight"], eps))

    # §3.3 block input
    ids = [anchor] + [mask] * (g - 1)
    x = [w["embed_tokens.weight"][t].clone() for t in ids]

    for li in range(cfg["num_hidden_layers"]):
        p = f"layers.{li}."
        a = p + "self_attn."
        h = [_rmsnorm(x[s], w[p + "input_layernorm.weight"], eps) for s in range(g)]
        key_rows = ctx + h  # context rows (no input_layernorm) then block rows
        key_pos = [first_pos + j for j in range(n_ctx)] + [start + s for s in range(g)]
        keys, vals = [], []  # [row][kv head] -> vec
        for row, pos in zip(key_rows, key_pos, strict=True):
            kf = torch.mv(w[a + "k_proj.weight"], row)
            vf = torch.mv(w[a + "v_proj.weight"], row)
            keys.append(
                [
                    _rope(_rmsnorm(kf[j * D : (j + 1) * D], w[a + "k_norm.weight"], eps), pos, theta)
                    for j in range(nkv)
                ]
            )
            vals.append([vf[j * D : (j + 1) * D] for j in range(nkv)])
        new_x = []
        for s in range(g):
            qf = torch.mv(w[a + "q_proj.weight"], h[s])
            o = torch.zeros(nh * D)
            for hd in range(nh):
                q = _rope(_rmsnorm(qf[hd * D : (hd + 1) * D], w[a + "q_norm.weight"], eps), start + s, theta)
                kvh = hd // (nh // nkv)
                scores = [float(torch.dot(q, keys[j][kvh])) / math.sqrt(D) for j in range(len(keys))]
                mx = max(scores)
                ex = [math.exp(sc - mx) for sc in scores]
                tot = sum(ex)
                acc = torch.zeros(D)
                for j in range(len(keys)):
                    acc += (ex[j] / tot) * vals[j][kvh]
                o[hd * D : (hd + 1) * D] = acc
            xs = x[s] + torch.mv(w[a + "o_proj.weight"], o)
            hm = _rmsnorm(xs, w[p + "post_attention_layernorm.weight"], eps)
            gate = torch.mv(w[p + "mlp.gate_proj.weight"], hm)
            up = torch.mv(w[p + "mlp.up_proj.weight"], hm)
            act = gate / (1.0 + torch.exp(-gate)) * up
            new_x.append(xs + torch.mv(w[p + "mlp.down_proj.weight"], act))
        x = new_x

    hidden = torch.stack([_rmsnorm(x[s], w["norm.weight"], eps) for s in range(g)])
    base = torch.stack([torch.mv(w["lm_head.weight"], hidden[s]) for s in range(g)])

    # §4 sequential heads
    rank = cfg.get("markov_rank") or 0
    htype = cfg.get("markov_head_type", "vanilla")
    V = base.shape[1]
    prev = anchor
    state = torch.zeros(rank)
    tokens, zs, embs = [], [], []
    for k in range(g):
        z = base[k].clone()
        e = w["markov_head.markov_w1.weight"][prev].clone() if rank else torch.zeros(0)
        if rank:
            if htype == "vanilla":
                z = z + torch.mv(w["markov_head.markov_w2.weight"], e)
            elif htype == "gated":
                pre = (
                    torch.mv(w["markov_head.gate_proj.weight"], torch.cat([hidden[k], e]))
                    + w["markov_head.gate_proj.bias"]
                )
                gt = 1.0 / (1.0 + torch.exp(-pre))
                z = z + torch.mv(w["markov_head.markov_w2.weight"], gt * e)
            else:
                out = (
                    torch.mv(w["markov_head.joint_proj.weight"], torch.cat([state, e, hidden[k]]))
                    + w["markov_head.joint_proj.bias"]
                )
                ga, ca, oa = out[:rank], out[rank : 2 * rank], out[2 * rank :]
                sg = 1.0 / (1.0 + torch.exp(-ga))
                state = sg * state + (1 - sg) * torch.tanh(ca)
                z = z + torch.mv(w["markov_head.markov_w2.weight"], torch.tanh(oa))
        if temperature == 0:
            best = max(range(V), key=lambda v: (float(z[v]), -v))
        else:
            idx = torch.arange(V)
            _, gum = philox_draw_ref(seed, offset, torch.full((V,), request), torch.full((V,), k), 1, idx)
            sc = [float(z[v]) / temperature + float(gum[v]) for v in range(V)]
            best = max(range(V), key=lambda v: (sc[v], -v))
        tokens.append(best)
        zs.append(z)
        embs.append(e)
        prev = best

    res = dict(hidden=hidden, base=base, z=torch.stack(zs), tokens=torch.tensor(tokens))
    res["conf_logit"] = res["conf"] = res["survival"] = None
    if cfg.get("enable_confidence_head"):
        wt = w["confidence_head.proj.weight"][0]
        b = float(w["confidence_head.proj.bias"][0])
        use_e = rank > 0 and cfg.get("confidence_head_with_markov", True)
        logits, confs, surv = [], [], []
        run = 1.0
        for k in range(g):
            inp = torch.cat([hidden[k], embs[k]]) if use_e else hidden[k]
            lg = float(torch.dot(wt, inp)) + b
            c = _sigmoid(lg)
            run *= c
            logits.append(lg)
            confs.append(c)
            surv.append(run)
        res["conf_logit"], res["conf"], res["survival"] = (torch.tensor(v) for v in (logits, confs, surv))
    return res


def random_checkpoint_tensors(cfg, gen, with_embeddings=True):
    """Random tensors with DeepSpec's names and shapes (§2.2), from the config dict."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    D = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    inter = cfg["intermediate_size"]
    m = len(cfg["target_layer_ids"])
    r = cfg.get("markov_rank") or 0

    def rnd(*shape, std=0.2):
        return torch.randn(*shape, generator=gen) * std

    def norm(n):
        return 1.0 + rnd(n, std=0.1)

    t = {}
    if with_embeddings:
        t["embed_tokens.weight"] = rnd(V, H, std=1.0)
        t["lm_head.weight"] = rnd(V, H, std=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = rnd(q, H)
        t[p + "self_attn.k_proj.weight"] = rnd(kv, H)
        t[p + "self_attn.v_proj.weight"] = rnd(kv, H)
        t[p + "self_attn.o_proj.weight"] = rnd(H, q)
        t[p + "self_attn.q_norm.weight"] = norm(D)
        t[p + "self_attn.k_norm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        t[p + "mlp.gate_proj.weight"] = rnd(inter, H)
        t[p + "mlp.up_proj.weight"] = rnd(inter, H)
        t[p + "mlp.down_proj.weight"] = rnd(H, inter)
    t["norm.weight"] = norm(H)
    t["fc.weight"] = rnd(H, m * H)
    t["hidden_norm.weight"] = norm(H)
    if r:
        t["markov_head.markov_w1.weight"] = rnd(V, r, std=1.0)
        t["markov_head.markov_w2.weight"] = rnd(V, r, std=0.5)
        if cfg["markov_head_type"] == "gated":
            t["markov_head.gate_proj.weight"] = rnd(r, H + r)
            t["markov_head.gate_proj.bias"] = rnd(r)
        elif cfg["markov_head_type"] == "rnn":
            t["markov_head.joint_proj.weight"] = rnd(3 * r, 2 * r + H)
            t["markov_head.joint_proj.bias"] = rnd(3 * r)
    if cfg.get("enable_confidence_head"):
        rc = r if (r and cfg.get("confidence_head_with_markov", True)) else 0
        t["confidence_head.proj.weight"] = rnd(1, H + rc)
        t["confidence_head.proj.bias"] = rnd(1)
    return t

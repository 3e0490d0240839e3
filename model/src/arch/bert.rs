//! BERT-style encoders for embeddings (`bert`, `nomic-bert`), as llama.cpp builds them: token
//! embeddings plus token type 0 (plus learned positions for `bert`), a layer norm, then blocks
//! of attention over the whole text (not causal, no KV cache), residual add and layer norm,
//! feed-forward, residual add and layer norm. `bert` has separate biased q/k/v projections and
//! a GELU feed-forward; `nomic-bert` one fused q/k/v projection, split-half rope and SwiGLU.
//! The last hidden state is the output: there is no final norm and no output head.

use ggml_graph::{Act, AttnParams, DType, TensorId};

use super::Builder;
use crate::config::Architecture;
use crate::error::ModelError;

/// Builds the encoder; returns the last hidden state `[n_embd, n_tok]`.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let c = b.cfg;
    let nt = b.batch.n_tok;
    // Every token attends to every other one, so a pass must hold the whole text of one
    // sequence: the batch engine runs encoders only that way (`BatchEngine::embed`; it refuses
    // generation), while dry builds for placement and memory estimates use any batch shape.
    if nt > c.n_ctx_train {
        return Err(ModelError::ContextFull {
            needed: nt,
            n_ctx: c.n_ctx_train,
        });
    }
    let e = c.n_embd;
    let table = b.weight_shaped("token_embd.weight", &[e, c.n_vocab])?;
    let mut x = b.g.get_rows(table, b.tokens)?;
    if let Some(tt) = b.weight_opt("token_types.weight")? {
        // Every token is of type 0 ("sentence A"), as in llama.cpp: the table's first row.
        let t = b.g.tensor(tt)?;
        if t.dtype != DType::F32 || t.ne[0] != e {
            return Err(ModelError::BadTensor {
                name: "token_types.weight".into(),
                reason: format!("expected f32 rows of {e}, found {} {:?}", t.dtype, t.ne),
            });
        }
        let row0 = b.g.view(tt, &[e], &[], 0)?;
        x = b.g.add(x, row0)?;
    }
    if c.arch == Architecture::Bert {
        let pe = b.weight("position_embd.weight")?;
        let p = b.g.get_rows(pe, b.pos)?;
        x = b.g.add(p, x)?;
    }
    b.g.set_name(x, "inp_embd")?;
    let mut x = b.layer_norm(x, "token_embd_norm")?;
    let (hd, hdv, nh, nkv) = (c.head_dim, c.head_dim_v, c.n_head, c.n_head_kv);
    for il in 0..c.n_layer {
        let (q, k, v) = b.qkv_projections(il, x, &super::Part::whole(b.cfg))?;
        let mut q = b.g.reshape(q, &[hd, nh, nt])?;
        let mut k = b.g.reshape(k, &[hd, nkv, nt])?;
        let v = b.g.reshape(v, &[hdv, nkv, nt])?;
        if c.arch == Architecture::NomicBert {
            let rp = b.rope_params(&c.layers[il]);
            q = b.g.rope(q, b.pos, rp, None)?;
            k = b.g.rope(k, b.pos, rp, None)?;
        }
        b.tag(q, "Qcur", il)?;
        b.tag(k, "Kcur", il)?;
        b.tag(v, "Vcur", il)?;
        let params = AttnParams {
            scale: c.attn_scale,
            causal: false,
            window: None,
            softcap: None,
            sinks: false,
        };
        // Keys and values stay f32, as in llama.cpp's attention without a cache.
        let o = b.g.attention(q, k, v, b.pos, None, params)?;
        let o = b.g.reshape(o, &[hdv * nh, nt])?;
        b.tag(o, "kqv_out", il)?;
        let o = b.linear(o, &format!("blk.{il}.attn_output"))?;
        let x1 = b.g.add(o, x)?;
        let x1 = b.layer_norm(x1, &format!("blk.{il}.attn_output_norm"))?;
        b.tag(x1, "ffn_inp", il)?;
        let f = if c.arch == Architecture::Bert {
            let up = b.linear(x1, &format!("blk.{il}.ffn_up"))?;
            let h = b.g.gelu(up)?;
            b.linear(h, &format!("blk.{il}.ffn_down"))?
        } else {
            b.gated_ffn(il, x1, Act::Silu)?
        };
        b.tag(f, "ffn_out", il)?;
        let x2 = b.g.add(f, x1)?;
        x = b.layer_norm(x2, &format!("blk.{il}.layer_output_norm"))?;
        b.tag(x, "l_out", il)?;
    }
    Ok(x)
}

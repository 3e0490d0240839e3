//! Embedding encoders (a tiny synthetic BERT) through the server over real HTTP on the CPU:
//! `/v1/embeddings` pools as the file's `bert.pooling_type` says and answers the batch
//! engine's own vectors; generating with an encoder is refused with an error, not a crash.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use hyper::StatusCode;
use model::batch::{BatchEngine, EngineOptions, Pooling};
use model::text::TextModel;
use rocmforge_server::ServerOptions;
use serde_json::json;

use common::{session_options, start, with_metadata};

#[test]
fn bert_embeddings_pool_as_the_file_says() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let base = dir.join(format!("bert-{}.gguf", std::process::id()));
    let o = model::synth::SynthOptions::parse("bert", "tiny", "q8_0", 7).expect("options");
    model::synth::write(&o, None, &base).expect("write synthetic bert");
    let text = "hello world, an embedding";
    for (ty, pooling) in [
        (2u32, Pooling::First),
        (1, Pooling::Mean),
        (3, Pooling::Last),
    ] {
        let path = with_metadata(&base, &format!("pool{ty}"), "bert.pooling_type", ty);
        let tm = TextModel::load(&path, |_, _| {}).expect("load");
        let ids = tm.tokenizer().encode(text, true, true);
        let reference = BatchEngine::start(
            Arc::new(tm.model().clone()),
            EngineOptions {
                session: session_options(64),
                max_seqs: 1,
                n_ctx_per_seq: 64,
                step_tokens: 64,
                prefix_cache: false,
                ..EngineOptions::default()
            },
        )
        .expect("engine")
        .embed(ids.clone(), pooling)
        .expect("embed");
        let ts = start(&path, 2, ServerOptions::default());
        let c = ts.client(None);
        ts.rt.block_on(async {
            let r = c
                .post("/v1/embeddings", &json!({"input": text}))
                .await
                .expect("request");
            assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
            let v = r.json().expect("JSON");
            assert_eq!(v["usage"]["prompt_tokens"], ids.len());
            let got: Vec<f32> = v["data"][0]["embedding"]
                .as_array()
                .expect("floats")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect();
            assert_eq!(got, reference, "pooling type {ty}");

            let r = c
                .post(
                    "/v1/completions",
                    &json!({"prompt": text, "max_tokens": 4, "temperature": 0}),
                )
                .await
                .expect("request");
            assert_ne!(r.status, StatusCode::OK, "an encoder cannot generate");
            let e = r.json().expect("JSON error");
            let msg = e["error"]["message"].as_str().expect("error message");
            assert!(msg.contains("embedding model"), "{msg}");
        });
    }
}

//! `classify_text`: zero-shot text classification as an HTTP function.
//!
//! `POST {"text": "...", "labels": ["sports", "food", ...]}` (labels optional) answers
//! `{"label": "...", "score": 0.42, "scores": {...}}`. The text and every label are embedded by the
//! `embed_text` ensemble (WordPiece tokenizer → all-MiniLM-L6-v2 → mean pooling, L2-normalised)
//! in one call; the score of a label is the cosine similarity of its embedding with the text's.
//! The calls enter `embed_text`'s queue like any other request, so concurrent invocations are
//! batched together by the server.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_guest::{Request as InferRequest, Tensor};
use wstd::http::{Body, Error, Request, Response, StatusCode};

/// Labels used when the request names none.
const DEFAULT_LABELS: [&str; 5] = ["sports", "food", "technology", "politics", "music"];
/// Rows per call: `embed_text`'s max_batch_size.
const MAX_ROWS: usize = 8;

#[derive(Deserialize)]
struct Query {
    text: String,
    #[serde(default)]
    labels: Vec<String>,
}

#[derive(Serialize)]
struct Answer {
    label: String,
    score: f32,
    scores: BTreeMap<String, f32>,
}

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, Error> {
    if request.method() != "POST" {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            &serde_json::json!({"error": "POST {\"text\": ...}"}),
        );
    }
    let query: Query = match request.into_body().json().await {
        Ok(q) => q,
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"error": format!("expected {{\"text\": ..., \"labels\": [...]}}: {e}")}),
            );
        }
    };
    let labels: Vec<String> = if query.labels.is_empty() {
        DEFAULT_LABELS.iter().map(|l| (*l).to_owned()).collect()
    } else {
        query.labels
    };
    let mut texts = vec![query.text];
    texts.extend(labels.iter().cloned());
    let embeddings = match embed(&texts) {
        Ok(e) => e,
        Err(e) => {
            return reply(
                StatusCode::BAD_GATEWAY,
                &serde_json::json!({"error": format!("embed_text failed: {e}")}),
            );
        }
    };
    let (text, label_rows) = embeddings.split_at(1);
    let scores: BTreeMap<String, f32> = labels
        .iter()
        .zip(label_rows)
        .map(|(label, row)| (label.clone(), dot(&text[0], row)))
        .collect();
    let (label, score) = scores
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(l, s)| (l.clone(), *s))
        .unwrap_or_default();
    reply(
        StatusCode::OK,
        &Answer {
            label,
            score,
            scores,
        },
    )
}

/// One L2-normalised embedding per text, `MAX_ROWS` texts per call.
fn embed(texts: &[String]) -> Result<Vec<Vec<f32>>, tessera_guest::Error> {
    let mut rows = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(MAX_ROWS) {
        let input = Tensor::from_strings("TEXT", vec![chunk.len() as i64, 1], chunk);
        let mut response =
            tessera_guest::infer("embed_text", None, InferRequest::new(vec![input]))?;
        let embedding = response.take_output("EMBEDDING")?;
        let width = embedding.shape().last().copied().unwrap_or(0).max(1) as usize;
        rows.extend(embedding.as_f32()?.chunks(width).map(<[f32]>::to_vec));
    }
    Ok(rows)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn reply<T: Serialize>(status: StatusCode, value: &T) -> Result<Response<Body>, Error> {
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from_json(value)?)?)
}

//! `postprocess_topk`: turns classifier logits into the `k` best labels.
//!
//! Input `LOGITS`: FP32 `[batch, n]`. Request parameter `k` (integer, default 3, clamped to `n`).
//! Outputs, per row the `k` classes of highest softmax probability, best first (ties: lower
//! index first):
//! - `LABELS`: BYTES `[batch, k]`, each `"label:probability"` with 4 decimals, e.g. `"cat:0.8123"`;
//! - `INDICES`: INT64 `[batch, k]`, the classes' indices.
//!
//! The labels come from the `config.pbtxt` parameter `labels` (comma-separated, one per class):
//! `parameters { key: "labels" value { string_value: "cat,dog,..." } }`. Without it the class
//! index stands in for the label.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// `k` when the request sets none.
pub const DEFAULT_K: i64 = 3;

/// The handler: the labels, in class order.
pub struct PostprocessTopk {
    labels: Vec<String>,
}

impl Model for PostprocessTopk {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        let labels: Vec<String> = match config.parameter("labels") {
            Some(list) => list.split(',').map(|l| l.trim().to_owned()).collect(),
            None => {
                tessera_guest::log::warn(
                    "no 'labels' parameter in config.pbtxt: class indices stand in for labels",
                );
                Vec::new()
            }
        };
        if labels.iter().any(String::is_empty) {
            return Err("parameter 'labels' has an empty label".to_owned());
        }
        tessera_guest::log::info!("postprocess_topk ready with {} labels", labels.len());
        Ok(PostprocessTopk { labels })
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let k = request.parameter_i64("k")?.unwrap_or(DEFAULT_K);
        if k < 1 {
            return Err(Error::invalid_input(format!(
                "parameter 'k' must be at least 1, got {k}"
            )));
        }
        let logits = request.input("LOGITS")?.check(DataType::Fp32, &[-1, -1])?;
        let (batch, n) = (logits.dim(0)?, logits.dim(1)?);
        if n == 0 {
            return Err(Error::invalid_input(
                "LOGITS has no classes (shape [batch, 0])",
            ));
        }
        if !self.labels.is_empty() && self.labels.len() != n {
            return Err(Error::invalid_input(format!(
                "LOGITS has {n} classes but the model has {} labels",
                self.labels.len()
            )));
        }
        let k = usize::try_from(k).unwrap_or(usize::MAX).min(n);
        let values = logits.as_f32()?;

        let mut labels = Vec::with_capacity(batch * k);
        let mut indices = Vec::with_capacity(batch * k);
        for (row, chunk) in values.chunks_exact(n).enumerate() {
            let probabilities =
                softmax(chunk).map_err(|e| e.context(format!("LOGITS row {row}")))?;
            for index in top_k(&probabilities, k) {
                labels.push(format!("{}:{:.4}", self.label(index), probabilities[index]));
                indices.push(index as i64);
            }
        }
        let shape = [batch as i64, k as i64];
        let mut response = Response::new();
        if request.wants_output("LABELS") {
            response.push_output(Tensor::from_strings("LABELS", shape, &labels));
        }
        if request.wants_output("INDICES") {
            response.push_output(Tensor::from_i64("INDICES", shape, &indices));
        }
        Ok(response)
    }
}

impl PostprocessTopk {
    fn label(&self, index: usize) -> String {
        self.labels
            .get(index)
            .cloned()
            .unwrap_or_else(|| index.to_string())
    }
}

/// The softmax of one row, computed in f64 after subtracting the maximum. `-inf` logits get
/// probability 0; NaN and `+inf` are `invalid-input` errors.
pub fn softmax(logits: &[f32]) -> Result<Vec<f64>, Error> {
    if let Some(bad) = logits.iter().find(|x| x.is_nan() || **x == f32::INFINITY) {
        return Err(Error::invalid_input(format!(
            "logit {bad} is not a finite number"
        )));
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Err(Error::invalid_input("every logit is -inf"));
    }
    let exps: Vec<f64> = logits
        .iter()
        .map(|&x| (f64::from(x) - f64::from(max)).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    Ok(exps.into_iter().map(|e| e / sum).collect())
}

/// The indices of the `k` largest values, largest first; equal values keep index order.
pub fn top_k(values: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    let by_value_then_index =
        |a: &usize, b: &usize| values[*b].total_cmp(&values[*a]).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, by_value_then_index);
        order.truncate(k);
    }
    order.sort_by(by_value_then_index);
    order
}

tessera_guest::export_model!(PostprocessTopk);

#[cfg(test)]
mod tests {
    use super::*;

    fn model(labels: &str) -> PostprocessTopk {
        let json = format!(r#"{{"parameters":{{"labels":{{"string_value":"{labels}"}}}}}}"#);
        PostprocessTopk::initialize(&ModelConfig::from_json(&json).unwrap()).unwrap()
    }

    #[test]
    fn top_three_by_default_with_softmax_scores() {
        let mut m = model("cat, dog,bird,fish");
        let logits = Tensor::from_f32("LOGITS", [2, 4], &[1.0, 3.0, 2.0, 0.0, 0.0, 0.0, 0.0, 5.0]);
        let response = m.execute_request(Request::new(vec![logits])).unwrap();
        let labels = response.output("LABELS").unwrap();
        assert_eq!(labels.shape(), [2, 3]);
        assert_eq!(
            labels.as_strings().unwrap(),
            [
                "dog:0.6439",
                "bird:0.2369",
                "cat:0.0871",
                "fish:0.9802",
                "cat:0.0066",
                "dog:0.0066"
            ]
        );
        assert_eq!(
            *response.output("INDICES").unwrap().as_i64().unwrap(),
            [1, 2, 0, 3, 0, 1]
        );
    }

    #[test]
    fn k_parameter_is_honoured_and_clamped() {
        let mut m = model("a,b,c");
        let logits = Tensor::from_f32("LOGITS", [1, 3], &[0.5, 0.1, 0.9]);
        let request = Request::builder()
            .input(logits.clone())
            .parameter("k", 1)
            .build();
        let response = m.execute_request(request).unwrap();
        assert_eq!(
            response.output("LABELS").unwrap().as_strings().unwrap(),
            ["c:0.4718"]
        );
        let request = Request::builder()
            .input(logits.clone())
            .parameter("k", 10)
            .build();
        assert_eq!(
            m.execute_request(request)
                .unwrap()
                .output("INDICES")
                .unwrap()
                .shape(),
            [1, 3]
        );
        let request = Request::builder().input(logits).parameter("k", 0).build();
        assert!(m.execute_request(request).unwrap_err().is_invalid_input());
    }

    #[test]
    fn label_count_must_match() {
        let mut m = model("a,b");
        let request = Request::new(vec![Tensor::from_f32("LOGITS", [1, 3], &[0.0; 3])]);
        assert!(m.execute_request(request).unwrap_err().is_invalid_input());
    }

    #[test]
    fn softmax_is_stable_and_rejects_nan() {
        let p = softmax(&[1000.0, 1000.0, f32::NEG_INFINITY]).unwrap();
        assert_eq!(p, [0.5, 0.5, 0.0]);
        assert!(softmax(&[f32::NAN, 1.0]).is_err());
    }

    #[test]
    fn top_k_orders_ties_by_index() {
        assert_eq!(top_k(&[0.2, 0.5, 0.2, 0.1], 3), [1, 0, 2]);
        assert_eq!(top_k(&[0.1], 1), [0]);
    }
}

//! `pool_embeddings`: sentence embeddings from a transformer's token embeddings, as
//! sentence-transformers' `Pooling(mean)` followed by `Normalize` computes them.
//!
//! Inputs `TOKEN_EMBEDDINGS`: FP32 `[batch, seq, dim]` and `ATTENTION_MASK`: INT64
//! `[batch, seq]` (1 for a real token, 0 for padding). Output `EMBEDDING`: FP32 `[batch, dim]`,
//! the mean of each row's unmasked token embeddings, scaled to unit L2 norm.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// The handler. It keeps no state.
pub struct PoolEmbeddings;

impl Model for PoolEmbeddings {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(PoolEmbeddings)
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let embeddings = request
            .input("TOKEN_EMBEDDINGS")?
            .check(DataType::Fp32, &[-1, -1, -1])?;
        let mask = request
            .input("ATTENTION_MASK")?
            .check(DataType::Int64, &[-1, -1])?;
        let (batch, seq, dim) = (embeddings.dim(0)?, embeddings.dim(1)?, embeddings.dim(2)?);
        if mask.shape() != &embeddings.shape()[..2] {
            return Err(Error::invalid_input(format!(
                "ATTENTION_MASK has shape {:?}, expected [batch, seq] = {:?} from TOKEN_EMBEDDINGS",
                mask.shape(),
                &embeddings.shape()[..2]
            )));
        }
        let pooled = mean_pool_normalize(&embeddings.as_f32()?, &mask.as_i64()?, batch, seq, dim)?;
        Ok(Response::new().with_output(Tensor::from_f32(
            "EMBEDDING",
            [batch as i64, dim as i64],
            &pooled,
        )))
    }
}

/// Masked mean over the sequence, then L2 normalisation, for `batch` rows of `seq` tokens of
/// `dim` values. A row with no unmasked token pools to zeros (sentence-transformers divides by
/// `max(count, 1e-9)` and normalises with `max(norm, 1e-12)`, which gives the same).
pub fn mean_pool_normalize(
    embeddings: &[f32],
    mask: &[i64],
    batch: usize,
    seq: usize,
    dim: usize,
) -> Result<Vec<f32>, Error> {
    if let Some(bad) = mask.iter().find(|&&m| m != 0 && m != 1) {
        return Err(Error::invalid_input(format!(
            "ATTENTION_MASK values must be 0 or 1, found {bad}"
        )));
    }
    let mut out = Vec::with_capacity(batch * dim);
    let mut sum = vec![0f64; dim];
    for row in 0..batch {
        sum.fill(0.0);
        let mut count = 0usize;
        for position in 0..seq {
            if mask[row * seq + position] == 0 {
                continue;
            }
            count += 1;
            let token = &embeddings[(row * seq + position) * dim..][..dim];
            for (s, &v) in sum.iter_mut().zip(token) {
                *s += f64::from(v);
            }
        }
        let count = (count as f64).max(1e-9);
        let norm = sum
            .iter()
            .map(|s| (s / count) * (s / count))
            .sum::<f64>()
            .sqrt()
            .max(1e-12);
        out.extend(sum.iter().map(|s| (s / count / norm) as f32));
    }
    Ok(out)
}

tessera_guest::export_model!(PoolEmbeddings);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_only_unmasked_tokens_and_normalises() {
        // Row 0: tokens (3, 0) and (1, 0) kept, (100, 100) masked -> mean (2, 0) -> (1, 0).
        // Row 1: tokens (0, 3) and (4, 0) kept -> mean (2, 1.5) -> (0.8, 0.6).
        let embeddings = Tensor::from_f32(
            "TOKEN_EMBEDDINGS",
            [2, 3, 2],
            &[
                3.0, 0.0, 1.0, 0.0, 100.0, 100.0, 0.0, 3.0, 4.0, 0.0, 9.0, 9.0,
            ],
        );
        let mask = Tensor::from_i64("ATTENTION_MASK", [2, 3], &[1, 1, 0, 1, 1, 0]);
        let response = PoolEmbeddings
            .execute_request(Request::new(vec![embeddings, mask]))
            .unwrap();
        let out = response.output("EMBEDDING").unwrap();
        assert_eq!(out.shape(), [2, 2]);
        let v = out.as_f32().unwrap();
        let expected = [1.0, 0.0, 0.8, 0.6];
        assert!(
            v.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-6),
            "{v:?}"
        );
    }

    #[test]
    fn all_masked_row_is_zero() {
        assert_eq!(
            mean_pool_normalize(&[1.0, 2.0], &[0], 1, 1, 2).unwrap(),
            [0.0, 0.0]
        );
    }

    #[test]
    fn rejects_mismatched_mask() {
        let embeddings = Tensor::from_f32("TOKEN_EMBEDDINGS", [1, 2, 1], &[1.0, 2.0]);
        let mask = Tensor::from_i64("ATTENTION_MASK", [1, 3], &[1, 1, 1]);
        let err = PoolEmbeddings
            .execute_request(Request::new(vec![embeddings, mask]))
            .unwrap_err();
        assert!(err.is_invalid_input());
        let embeddings = Tensor::from_f32("TOKEN_EMBEDDINGS", [1, 1, 1], &[1.0]);
        let mask = Tensor::from_i64("ATTENTION_MASK", [1, 1], &[2]);
        assert!(
            PoolEmbeddings
                .execute_request(Request::new(vec![embeddings, mask]))
                .is_err()
        );
    }
}

use tessera_guest::{Model, ModelConfig, Request, Tensor};

use crate::AddSub;

fn model() -> AddSub {
    AddSub::initialize(&ModelConfig::from_json("{}").unwrap()).unwrap()
}

fn request(a: &[f32], b: &[f32], rows: i64) -> Request {
    Request::new(vec![
        Tensor::from_f32("INPUT0", [rows, 16], a),
        Tensor::from_f32("INPUT1", [rows, 16], b),
    ])
}

#[test]
fn takes_the_shape_from_its_config() {
    let config = r#"{"max_batch_size": 0, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["4"]}]}"#;
    let mut m = AddSub::initialize(&ModelConfig::from_json(config).unwrap()).unwrap();
    let four = Request::new(vec![
        Tensor::from_f32("INPUT0", [4], &[1.0, 2.0, 3.0, 4.0]),
        Tensor::from_f32("INPUT1", [4], &[1.0; 4]),
    ]);
    let response = m.execute_request(four).unwrap();
    assert_eq!(
        *response.output("OUTPUT1").unwrap().as_f32().unwrap(),
        [0.0, 1.0, 2.0, 3.0]
    );
    assert!(
        m.execute_request(request(&[1.0; 16], &[2.0; 16], 1))
            .unwrap_err()
            .is_invalid_input()
    );
}

#[test]
fn sum_and_difference_for_every_row() {
    let a: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let b = vec![1.0; 32];
    let response = model().execute_request(request(&a, &b, 2)).unwrap();
    let sum = response.output("OUTPUT0").unwrap();
    assert_eq!(sum.shape(), [2, 16]);
    assert_eq!(sum.as_f32().unwrap()[31], 32.0);
    assert_eq!(
        response.output("OUTPUT1").unwrap().as_f32().unwrap()[0],
        -1.0
    );
}

#[test]
fn each_request_of_a_batch_is_judged_alone() {
    let good = request(&[1.0; 16], &[2.0; 16], 1);
    let bad = request(&[1.0; 15], &[2.0; 15], 1);
    let wrong_width = Request::new(vec![
        Tensor::from_f32("INPUT0", [1, 8], &[0.0; 8]),
        Tensor::from_f32("INPUT1", [1, 8], &[0.0; 8]),
    ]);
    let results = model().execute(vec![good, bad, wrong_width]);
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok());
    assert!(results[1].as_ref().unwrap_err().is_invalid_input());
    assert!(results[2].as_ref().unwrap_err().is_invalid_input());
}

#[test]
fn honours_requested_outputs() {
    let r = Request::builder()
        .input(Tensor::from_f32("INPUT0", [1, 16], &[3.0; 16]))
        .input(Tensor::from_f32("INPUT1", [1, 16], &[1.0; 16]))
        .requested_output("OUTPUT1")
        .build();
    let response = model().execute_request(r).unwrap();
    assert_eq!(response.outputs().len(), 1);
    assert_eq!(
        *response.output("OUTPUT1").unwrap().as_f32().unwrap(),
        [2.0; 16]
    );
}

#[test]
fn rejects_mismatched_batch_sizes() {
    let r = Request::new(vec![
        Tensor::from_f32("INPUT0", [1, 16], &[0.0; 16]),
        Tensor::from_f32("INPUT1", [2, 16], &[0.0; 32]),
    ]);
    assert!(model().execute_request(r).unwrap_err().is_invalid_input());
}

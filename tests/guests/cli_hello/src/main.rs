//! Test fixture: a `wasi:cli/command` component. Deploying it as a model must fail with a 400
//! that says it is not of the `tessera:inference/model` world.

fn main() {
    println!("hello from another world");
}

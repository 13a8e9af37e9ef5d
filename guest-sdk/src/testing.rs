//! Helpers for testing handlers natively (`cargo test` on the build machine), where there is no
//! Tessera host to answer [`infer`](crate::infer). Absent from Wasm builds.

use std::cell::RefCell;

use crate::{Error, Request, Response};

type InferFn = Box<dyn FnMut(&str, Option<i64>, Request) -> Result<Response, Error>>;

thread_local! {
    static INFER: RefCell<Option<InferFn>> = const { RefCell::new(None) };
}

/// Makes [`infer`](crate::infer) call `f` on this thread, standing in for the other models a BLS
/// handler calls.
///
/// ```
/// use tessera_guest::{infer, testing, Request, Response, Tensor};
///
/// testing::set_infer(|model, _version, request| {
///     assert_eq!(model, "echo");
///     Ok(Response::from(request.into_inputs()))
/// });
/// let request = Request::new(vec![Tensor::from_f32("X", [1], &[2.0])]);
/// let response = infer("echo", None, request)?;
/// assert_eq!(*response.output("X")?.as_f32()?, [2.0]);
/// testing::clear_infer();
/// # Ok::<(), tessera_guest::Error>(())
/// ```
pub fn set_infer(f: impl FnMut(&str, Option<i64>, Request) -> Result<Response, Error> + 'static) {
    INFER.with_borrow_mut(|slot| *slot = Some(Box::new(f)));
}

/// Removes the function [`set_infer`] installed on this thread.
pub fn clear_infer() {
    INFER.with_borrow_mut(|slot| *slot = None);
}

pub(crate) fn call_infer(
    model: &str,
    version: Option<i64>,
    request: Request,
) -> Result<Response, Error> {
    // Taken out while it runs, so that it may itself call `infer` without a double borrow.
    let taken = INFER.with_borrow_mut(Option::take);
    let Some(mut f) = taken else {
        return Err(Error::internal(format!(
            "infer('{model}') needs a Tessera host: outside a Wasm component install a stand-in with tessera_guest::testing::set_infer"
        )));
    };
    let result = f(model, version, request);
    INFER.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot = Some(f);
        }
    });
    result
}

//! Ensembles (placeholder).
use super::{LoadContext, LoadError, ModelInstance};

pub fn load(_ctx: &LoadContext) -> Result<Vec<Box<dyn ModelInstance>>, LoadError> {
    Err(LoadError::new("ensembles are not supported yet"))
}

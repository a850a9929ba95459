//! What the report says about the run itself, kept out of the report's own module so that
//! `saved`, which writes it beside the results and reads it back, and the report that prints
//! it do not use each other.

use crate::systems::System;

/// Facts about the run, printed at the top of the report.
#[derive(Debug)]
pub struct Meta {
    pub command: String,
    pub date: String,
    pub machine: String,
    pub elapsed_secs: f64,
    pub quick: bool,
    pub systems: Vec<System>,
    pub notes: Vec<String>,
}

#![doc = include_str!("../README.md")]

pub mod api;
pub mod controller;
pub mod crd;
pub mod http;
pub mod metrics;
pub mod resources;
pub mod status;

#![doc = include_str!("../README.md")]

pub mod builder;
pub mod decode;
pub mod error;
pub mod flat;
pub mod folded;
pub mod limits;
mod prescan;
pub mod profile;
pub mod proto;
pub mod protobuf_fields;
pub mod view;

pub use builder::{FunctionSpec, LabelValue, MappingSpec, ProfileBuilder, encode_gzip};
pub use decode::{
    decode, decode_flat, decode_flat_reserving, decode_reserving, is_gzip, maybe_gunzip,
    validate_message,
};
pub use error::PprofError;
pub use flat::{FlatProfile, LocationRef, SampleRef};
pub use limits::DecodeLimits;
pub use profile::Profile;
pub use view::{DecodedProfile, ProfileView};

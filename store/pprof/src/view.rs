//! One read-only view over a validated profile, whichever way it was
//! decoded: the prost message ([`Profile`], which callers edit) or the
//! flat tables read straight from the wire ([`FlatProfile`], which the
//! store ingests). The engine's ingest reads profiles only through it.

use crate::flat::{FlatProfile, LocationRef, SampleRef};
use crate::profile::Profile;
use crate::proto;

/// What ingest reads from a validated profile. Every index and id these
/// methods hand out was checked by validation, so lookups with them resolve.
pub trait ProfileView {
    /// The string at `index` (`""` out of range).
    fn string(&self, index: i64) -> &str;
    /// Number of strings, index 0 being `""`.
    fn string_count(&self) -> usize;
    /// The sample types, one per value in each sample.
    fn sample_types(&self) -> &[proto::ValueType];
    /// The kind of event between samples, if declared.
    fn period_type(&self) -> Option<&proto::ValueType>;
    /// Wall time of collection, ns since the epoch (0 if unset).
    fn time_nanos(&self) -> i64;
    /// How long the profile covers, in ns (0 for point-in-time profiles).
    fn duration_nanos(&self) -> i64;
    /// Number of samples.
    fn sample_count(&self) -> usize;
    /// The sample at position `index` (empty past the end).
    fn sample(&self, index: usize) -> SampleRef<'_>;
    /// Number of locations.
    fn location_count(&self) -> usize;
    /// The location at table position `position`.
    fn location_at(&self, position: usize) -> Option<LocationRef<'_>>;
    /// The table position of location `id`.
    fn location_position(&self, id: u64) -> Option<usize>;
    /// Number of functions.
    fn function_count(&self) -> usize;
    /// The function at table position `position`.
    fn function_at(&self, position: usize) -> Option<&proto::Function>;
    /// The table position of function `id`.
    fn function_position(&self, id: u64) -> Option<usize>;
    /// The mapping with id `id`; `None` for 0 or a dangling id.
    fn mapping(&self, id: u64) -> Option<&proto::Mapping>;
}

impl ProfileView for Profile {
    fn string(&self, index: i64) -> &str {
        Profile::string(self, index)
    }
    fn string_count(&self) -> usize {
        self.strings().len()
    }
    fn sample_types(&self) -> &[proto::ValueType] {
        Profile::sample_types(self)
    }
    fn period_type(&self) -> Option<&proto::ValueType> {
        Profile::period_type(self)
    }
    fn time_nanos(&self) -> i64 {
        Profile::time_nanos(self)
    }
    fn duration_nanos(&self) -> i64 {
        Profile::duration_nanos(self)
    }
    fn sample_count(&self) -> usize {
        self.samples().len()
    }
    fn sample(&self, index: usize) -> SampleRef<'_> {
        self.samples().get(index).map_or(
            SampleRef {
                location_ids: &[],
                values: &[],
                labels: &[],
            },
            |s| SampleRef {
                location_ids: &s.location_id,
                values: &s.value,
                labels: &s.label,
            },
        )
    }
    fn location_count(&self) -> usize {
        self.locations().len()
    }
    fn location_at(&self, position: usize) -> Option<LocationRef<'_>> {
        self.locations().get(position).map(|l| LocationRef {
            id: l.id,
            mapping_id: l.mapping_id,
            address: l.address,
            lines: &l.line,
            is_folded: l.is_folded,
        })
    }
    fn location_position(&self, id: u64) -> Option<usize> {
        Profile::location_position(self, id)
    }
    fn function_count(&self) -> usize {
        self.functions().len()
    }
    fn function_at(&self, position: usize) -> Option<&proto::Function> {
        self.functions().get(position)
    }
    fn function_position(&self, id: u64) -> Option<usize> {
        Profile::function_position(self, id)
    }
    fn mapping(&self, id: u64) -> Option<&proto::Mapping> {
        Profile::mapping(self, id)
    }
}

impl ProfileView for FlatProfile {
    fn string(&self, index: i64) -> &str {
        FlatProfile::string(self, index)
    }
    fn string_count(&self) -> usize {
        FlatProfile::string_count(self)
    }
    fn sample_types(&self) -> &[proto::ValueType] {
        FlatProfile::sample_types(self)
    }
    fn period_type(&self) -> Option<&proto::ValueType> {
        FlatProfile::period_type(self)
    }
    fn time_nanos(&self) -> i64 {
        FlatProfile::time_nanos(self)
    }
    fn duration_nanos(&self) -> i64 {
        FlatProfile::duration_nanos(self)
    }
    fn sample_count(&self) -> usize {
        FlatProfile::sample_count(self)
    }
    fn sample(&self, index: usize) -> SampleRef<'_> {
        FlatProfile::sample(self, index)
    }
    fn location_count(&self) -> usize {
        FlatProfile::location_count(self)
    }
    fn location_at(&self, position: usize) -> Option<LocationRef<'_>> {
        FlatProfile::location_at(self, position)
    }
    fn location_position(&self, id: u64) -> Option<usize> {
        FlatProfile::location_position(self, id)
    }
    fn function_count(&self) -> usize {
        self.functions().len()
    }
    fn function_at(&self, position: usize) -> Option<&proto::Function> {
        self.functions().get(position)
    }
    fn function_position(&self, id: u64) -> Option<usize> {
        FlatProfile::function_position(self, id)
    }
    fn mapping(&self, id: u64) -> Option<&proto::Mapping> {
        FlatProfile::mapping(self, id)
    }
}

/// A validated profile as the store carries it from decode to the head:
/// flat when the store decoded the bytes, a message when the server
/// decoded (and perhaps edited) it.
#[derive(Debug, Clone)]
pub enum DecodedProfile {
    /// Read straight from the wire.
    Flat(FlatProfile),
    /// Decoded through prost (and perhaps edited).
    Message(Profile),
}

impl DecodedProfile {
    /// The whole profile as a prost message (strings as validation left
    /// them), to edit, re-encode or compare.
    pub fn to_message(&self) -> proto::Profile {
        match self {
            Self::Flat(flat) => flat.to_message(),
            Self::Message(profile) => profile.clone().into_raw(),
        }
    }
}

impl From<FlatProfile> for DecodedProfile {
    fn from(profile: FlatProfile) -> Self {
        Self::Flat(profile)
    }
}

impl From<Profile> for DecodedProfile {
    fn from(profile: Profile) -> Self {
        Self::Message(profile)
    }
}

macro_rules! either {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            DecodedProfile::Flat($p) => $e,
            DecodedProfile::Message($p) => $e,
        }
    };
}

impl ProfileView for DecodedProfile {
    fn string(&self, index: i64) -> &str {
        either!(self, p => ProfileView::string(p, index))
    }
    fn string_count(&self) -> usize {
        either!(self, p => ProfileView::string_count(p))
    }
    fn sample_types(&self) -> &[proto::ValueType] {
        either!(self, p => ProfileView::sample_types(p))
    }
    fn period_type(&self) -> Option<&proto::ValueType> {
        either!(self, p => ProfileView::period_type(p))
    }
    fn time_nanos(&self) -> i64 {
        either!(self, p => ProfileView::time_nanos(p))
    }
    fn duration_nanos(&self) -> i64 {
        either!(self, p => ProfileView::duration_nanos(p))
    }
    fn sample_count(&self) -> usize {
        either!(self, p => ProfileView::sample_count(p))
    }
    fn sample(&self, index: usize) -> SampleRef<'_> {
        either!(self, p => ProfileView::sample(p, index))
    }
    fn location_count(&self) -> usize {
        either!(self, p => ProfileView::location_count(p))
    }
    fn location_at(&self, position: usize) -> Option<LocationRef<'_>> {
        either!(self, p => ProfileView::location_at(p, position))
    }
    fn location_position(&self, id: u64) -> Option<usize> {
        either!(self, p => ProfileView::location_position(p, id))
    }
    fn function_count(&self) -> usize {
        either!(self, p => ProfileView::function_count(p))
    }
    fn function_at(&self, position: usize) -> Option<&proto::Function> {
        either!(self, p => ProfileView::function_at(p, position))
    }
    fn function_position(&self, id: u64) -> Option<usize> {
        either!(self, p => ProfileView::function_position(p, id))
    }
    fn mapping(&self, id: u64) -> Option<&proto::Mapping> {
        either!(self, p => ProfileView::mapping(p, id))
    }
}

//! What both sides of the server read off the wire the same way: a
//! request's content type, its body (read within limits, its
//! `Content-Encoding` undone), base64, and points in time as users and
//! Pyroscope clients write them. Pure, but for reading a body.

pub mod base64;
pub mod body;
pub mod content_type;
pub mod time;

//! Bytes as hostile clients write them: gzip, and the protobuf varints a
//! test needs to hand-encode a message no well-behaved client would send.

use std::io::Write;

/// `plain` gzipped at the best ratio, as an attacker would to make a small
/// request inflate into a large one.
pub fn gzip(plain: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(plain).expect("gzip into a Vec");
    encoder.finish().expect("gzip into a Vec")
}

/// Appends `value` as a protobuf varint.
pub fn push_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut out = Vec::new();
        push_varint(&mut out, 1);
        push_varint(&mut out, 300);
        assert_eq!(out, [0x01, 0xac, 0x02]);
    }

    #[test]
    fn gzip_round_trips() {
        let packed = gzip(&b"0,".repeat(1000));
        let mut plain = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&packed[..]), &mut plain)
            .expect("gunzip");
        assert_eq!(plain.len(), 2000);
        assert!(packed.len() < 100, "{} bytes", packed.len());
    }
}

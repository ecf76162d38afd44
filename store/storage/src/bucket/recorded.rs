//! Recorded series in object storage, beside the blocks:
//! `recorded/<replica>/<kind>_<ulid>_<start>_<end>.krec`. The name carries
//! the time range its points fall in (`[start, end)` unix ms), so a query
//! reads only the files its range touches, and retention deletes by name.
//! Kind `f` is a flush's points, named after the block the flush wrote
//! (written just before it, so recovery can delete one whose block never
//! made it); kind `m` is a merge of older files (one UTC day each), which
//! lists the files it replaces inside.

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use super::{Bucket, bucket_err};
use crate::error::StorageError;

const RECORDED_PREFIX: &str = "recorded";
const SUFFIX: &str = ".krec";

/// What a recorded file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedKind {
    /// One flush's points.
    Flush,
    /// A merge of older files.
    Merged,
}

/// One recorded file, as its name describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedName {
    /// The replica that wrote it (and alone merges and deletes it).
    pub replica: String,
    /// Flush or merge.
    pub kind: RecordedKind,
    /// The flushed block's id, or the merge's own.
    pub id: String,
    /// Its points' times, `[start, end)` unix ms.
    pub start_ms: i64,
    /// End of that range.
    pub end_ms: i64,
}

impl RecordedName {
    /// The object's path.
    pub fn path(&self) -> Path {
        Path::from(format!(
            "{RECORDED_PREFIX}/{}/{}",
            self.replica,
            self.file_name()
        ))
    }

    /// The file name, which merges list in what they replace.
    pub fn file_name(&self) -> String {
        let kind = match self.kind {
            RecordedKind::Flush => 'f',
            RecordedKind::Merged => 'm',
        };
        format!(
            "{kind}_{}_{}_{}{SUFFIX}",
            self.id, self.start_ms, self.end_ms
        )
    }

    /// Reads a listed path back; `None` for anything not written here.
    fn parse(path: &Path) -> Option<Self> {
        let mut parts = path.parts();
        if parts.next()?.as_ref() != RECORDED_PREFIX {
            return None;
        }
        let replica = parts.next()?.as_ref().to_owned();
        let file = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let stem = file.as_ref().strip_suffix(SUFFIX)?;
        let mut fields = stem.split('_');
        let kind = match fields.next()? {
            "f" => RecordedKind::Flush,
            "m" => RecordedKind::Merged,
            _ => return None,
        };
        let id = fields.next()?;
        ulid::Ulid::from_string(id).ok()?;
        let start_ms = fields.next()?.parse().ok()?;
        let end_ms = fields.next()?.parse().ok()?;
        if fields.next().is_some() || end_ms < start_ms {
            return None;
        }
        Some(Self {
            replica,
            kind,
            id: id.to_owned(),
            start_ms,
            end_ms,
        })
    }
}

impl Bucket {
    /// Writes a recorded file.
    pub async fn put_recorded(&self, name: &RecordedName, data: Bytes) -> Result<(), StorageError> {
        let path = name.path();
        self.store
            .put(&path, PutPayload::from_bytes(data))
            .await
            .map_err(bucket_err("put", &path))?;
        Ok(())
    }

    /// Every recorded file, of every replica.
    pub async fn list_recorded(&self) -> Result<Vec<RecordedName>, StorageError> {
        let prefix = Path::from(RECORDED_PREFIX);
        let mut names = Vec::new();
        let mut stream = self.store.list(Some(&prefix));
        while let Some(item) = stream.next().await {
            let object = item.map_err(bucket_err("list", &prefix))?;
            if let Some(name) = RecordedName::parse(&object.location) {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// Reads a recorded file, refusing one larger than `max_bytes`.
    pub async fn get_recorded(
        &self,
        name: &RecordedName,
        max_bytes: u64,
    ) -> Result<Bytes, StorageError> {
        let path = name.path();
        let head = self
            .store
            .head(&path)
            .await
            .map_err(bucket_err("head", &path))?;
        if head.size > max_bytes {
            return Err(StorageError::RecordedFile {
                name: name.file_name(),
                message: format!("{} bytes is over the limit of {max_bytes}", head.size),
            });
        }
        let result = self
            .store
            .get(&path)
            .await
            .map_err(bucket_err("get", &path))?;
        result.bytes().await.map_err(bucket_err("get", &path))
    }

    /// Deletes a recorded file; a missing one is not an error.
    pub async fn delete_recorded(&self, name: &RecordedName) -> Result<(), StorageError> {
        let path = name.path();
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(bucket_err("delete", &path)(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_strays_are_ignored() {
        let name = RecordedName {
            replica: "kiln-0".to_owned(),
            kind: RecordedKind::Merged,
            id: ulid::Ulid::new().to_string(),
            start_ms: 86_400_000,
            end_ms: 172_800_000,
        };
        assert_eq!(RecordedName::parse(&name.path()), Some(name.clone()));
        for stray in [
            "recorded/kiln-0/x_01ARZ3NDEKTSV4RRFFQ69G5FAV_1_2.krec",
            "recorded/kiln-0/f_notaulid_1_2.krec",
            "recorded/kiln-0/f_01ARZ3NDEKTSV4RRFFQ69G5FAV_2_1.krec",
            "recorded/kiln-0/f_01ARZ3NDEKTSV4RRFFQ69G5FAV_1_2.tmp",
            "recorded/f_01ARZ3NDEKTSV4RRFFQ69G5FAV_1_2.krec",
            "blocks/kiln-0/f_01ARZ3NDEKTSV4RRFFQ69G5FAV_1_2.krec",
        ] {
            assert_eq!(RecordedName::parse(&Path::from(stray)), None, "{stray}");
        }
    }
}

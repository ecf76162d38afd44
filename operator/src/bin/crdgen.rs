//! Prints every Kiln CRD as one multi-document YAML stream (`crds/` holds the same files split).

use std::io::Write;

fn main() -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    for (_, yaml) in kiln_operator::crd::render_crds()? {
        stdout.write_all(yaml.as_bytes())?;
    }
    Ok(())
}

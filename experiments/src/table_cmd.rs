//! `cxlfs table DIR`: a results directory as a text table on stdout.

use crate::results::{ResultsDirArgs, ResultsFile};
use crate::text_table::text_table;
use anyhow::Result;
use std::io::Write;

/// Handles `cxlfs table DIR`.
pub fn run(args: &ResultsDirArgs) -> Result<()> {
    let res = ResultsFile::read(&args.dir)?;
    std::io::stdout()
        .lock()
        .write_all(text_table(&res).as_bytes())?;
    Ok(())
}

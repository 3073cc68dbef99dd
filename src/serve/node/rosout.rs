//! The node's log: every `log` record goes through rcutils under the node's
//! logger name (`robot7.selectinfer_node` under `/robot7`), so it reaches
//! the console in ROS's format, `/rosout` (rcl's rosout sink) and the log
//! file, and `--ros-args --log-level debug` (or
//! `--log-level selectinfer_node:=debug`) sets what is written.
//! Records of other crates pass at warn and above only.

use r2r_rcl::{rcutils_logging_logger_is_enabled_for, RCUTILS_LOG_SEVERITY};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the ROS logger is installed; before that (no ROS context
/// yet), start-up errors are printed to stderr by the caller.
static INSTALLED: AtomicBool = AtomicBool::new(false);

struct RosLogger {
    name: String,
    c_name: CString,
}

fn severity(level: log::Level) -> r2r::LogSeverity {
    match level {
        log::Level::Error => r2r::LogSeverity::Error,
        log::Level::Warn => r2r::LogSeverity::Warn,
        log::Level::Info => r2r::LogSeverity::Info,
        log::Level::Debug | log::Level::Trace => r2r::LogSeverity::Debug,
    }
}

fn native(level: log::Level) -> RCUTILS_LOG_SEVERITY {
    match level {
        log::Level::Error => RCUTILS_LOG_SEVERITY::RCUTILS_LOG_SEVERITY_ERROR,
        log::Level::Warn => RCUTILS_LOG_SEVERITY::RCUTILS_LOG_SEVERITY_WARN,
        log::Level::Info => RCUTILS_LOG_SEVERITY::RCUTILS_LOG_SEVERITY_INFO,
        log::Level::Debug | log::Level::Trace => RCUTILS_LOG_SEVERITY::RCUTILS_LOG_SEVERITY_DEBUG,
    }
}

impl log::Log for RosLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        let ours = m.target().starts_with("selectinfer");
        if !ours && m.level() > log::Level::Warn {
            return false;
        }
        // SAFETY: a valid NUL-terminated name; rcutils reads its logger
        // levels under its own lock (set once by rcl_logging_configure).
        unsafe {
            rcutils_logging_logger_is_enabled_for(self.c_name.as_ptr(), native(m.level()) as i32)
        }
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let msg = record.args().to_string();
        // A NUL inside a message would make rcutils' C string fail: drop it.
        let msg = if msg.contains('\0') {
            msg.replace('\0', " ")
        } else {
            msg
        };
        r2r::log(
            &msg,
            &self.name,
            record.file().unwrap_or(""),
            record.line().unwrap_or(0),
            severity(record.level()),
        );
    }

    fn flush(&self) {}
}

/// Routes the `log` crate into rcutils under `logger_name` (the node's:
/// [`r2r::Node::logger`]). Call once, after the node exists (its rosout
/// publisher is made with it).
pub(super) fn install(logger_name: &str) -> anyhow::Result<()> {
    let c_name = CString::new(logger_name)?;
    log::set_boxed_logger(Box::new(RosLogger {
        name: logger_name.into(),
        c_name,
    }))
    .map_err(|e| anyhow::anyhow!("installing the ROS logger: {e}"))?;
    log::set_max_level(log::LevelFilter::Debug);
    INSTALLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether [`install`] ran: until then `log` records go nowhere.
pub(super) fn installed() -> bool {
    INSTALLED.load(Ordering::SeqCst)
}

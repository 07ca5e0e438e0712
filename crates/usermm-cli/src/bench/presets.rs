//! The usemem workloads' parameters, shared by `usermm bench` and `usermm compare`: plain
//! usemem, and vm-scalability's case-swap-w-seq and case-anon-r-seq presets sized from the
//! budget the way the case scripts size them from the machine:
//!
//! - case-swap-w-seq: `unit_size = (MemAvailable + SwapTotal) * 3 / 4`, split evenly over the
//!   tasks (`usemem -n $nr_task $((unit_size / nr_task))`); the budget stands for MemAvailable.
//! - case-anon-r-seq: `size = PTE_LIMIT / nr_task` capped at `AS_LIMIT`, `usemem -n $nr_task
//!   --readonly $size`, where hw_vars sets `PTE_LIMIT = mem_avail << 8` (the page tables of a
//!   read-only walk then take half of the available memory) and `AS_LIMIT = 1 << 46`. With the
//!   budget as mem_avail that is 256 x the budget in total; `--size` gives another total.
//!   Read faults on untouched anonymous memory map the zero page, so it needs no swap; usermm
//!   maps that much address space with overcommit (the commit limit would refuse it), the
//!   kernel engine with MAP_NORESERVE (usemem maps /dev/zero read-only, which is not
//!   accounted either).

use usermm::MmConfig;

use super::usemem::Params;
use crate::Failure;

/// vm-scalability's hw_vars: `AS_LIMIT=$((1<<46))`.
pub const AS_LIMIT: u64 = 1 << 46;
/// `PTE_LIMIT = mem_avail << 8`.
pub const PTE_LIMIT_SHIFT: u32 = 8;

/// Swap capacity a configuration asks for (0 without swap).
pub fn configured_swap_bytes(cfg: &MmConfig) -> u64 {
    // The command line never builds a custom device (size 0).
    cfg.swap.size()
}

fn at_least_one(opt: &str, v: u64) -> Result<(), Failure> {
    if v == 0 {
        return Err(Failure::Usage(format!("{opt}: must be at least 1")));
    }
    Ok(())
}

/// Most tasks (threads) a usemem-family workload starts. Each task is a thread with its own
/// region, stack and signal stack; far more than this exhausts the process's memory maps
/// (`vm.max_map_count`) long before it measures anything.
pub const MAX_TASKS: usize = 4096;

/// `--tasks` between 1 and [`MAX_TASKS`].
pub fn check_tasks(tasks: usize) -> Result<(), Failure> {
    at_least_one("--tasks", tasks as u64)?;
    if tasks > MAX_TASKS {
        return Err(Failure::Usage(format!(
            "--tasks: {tasks} is above the maximum of {MAX_TASKS} tasks (threads); use fewer tasks"
        )));
    }
    Ok(())
}

/// Plain usemem: `bytes_per_task` (already parsed), `step` in bytes.
#[allow(clippy::too_many_arguments)]
pub fn usemem(
    size_arg: &str,
    bytes_per_task: u64,
    tasks: usize,
    readonly: bool,
    step: u64,
    random: bool,
    repeat: u32,
    verify: bool,
) -> Result<Params, Failure> {
    check_tasks(tasks)?;
    at_least_one("--repeat", repeat as u64)?;
    let bytes_per_task = bytes_per_task & !7;
    if bytes_per_task == 0 {
        return Err(Failure::Usage(format!(
            "SIZE: {size_arg:?} is less than one 8-byte word; give at least 8 bytes per task"
        )));
    }
    if bytes_per_task.checked_mul(tasks as u64).is_none() {
        return Err(Failure::Usage(format!(
            "SIZE: {tasks} tasks x {bytes_per_task} bytes overflows 64 bits"
        )));
    }
    Ok(Params {
        workload: "usemem".into(),
        tasks,
        bytes_per_task,
        readonly,
        // usemem: `if (step < sizeof(long)) step = sizeof(long);`
        step: step.max(8),
        random,
        repeat,
        verify,
    })
}

/// case-swap-w-seq: total = 3/4 x (budget + swap), split evenly (4 KiB multiples).
pub fn swap_w_seq(cfg: &MmConfig, tasks: usize, verify: bool) -> Result<Params, Failure> {
    check_tasks(tasks)?;
    let total = cfg.budget.saturating_add(configured_swap_bytes(cfg)) / 4 * 3;
    let per = (total / tasks as u64) & !4095;
    if per == 0 {
        return Err(Failure::Usage(format!(
            "--tasks: {tasks} tasks leave less than one 4 KiB page each of the {total} bytes \
             (3/4 of budget + swap); use fewer tasks or a larger budget"
        )));
    }
    Ok(Params {
        workload: "swap-w-seq".into(),
        tasks,
        bytes_per_task: per,
        readonly: false,
        step: 8,
        random: false,
        repeat: 1,
        verify,
    })
}

/// case-anon-r-seq: read-only, total = `total` or 256 x budget, per task capped at AS_LIMIT.
pub fn anon_r_seq(
    cfg: &MmConfig,
    tasks: usize,
    total: Option<u64>,
    verify: bool,
) -> Result<Params, Failure> {
    check_tasks(tasks)?;
    let total = total.unwrap_or_else(|| cfg.budget.saturating_mul(1 << PTE_LIMIT_SHIFT));
    let per = ((total / tasks as u64).min(AS_LIMIT)) & !4095;
    if per == 0 {
        return Err(Failure::Usage(format!(
            "--size: {total} bytes over {tasks} tasks leave less than one 4 KiB page each"
        )));
    }
    Ok(Params {
        workload: "anon-r-seq".into(),
        tasks,
        bytes_per_task: per,
        readonly: true,
        step: 8,
        random: false,
        repeat: 1,
        verify,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_w_seq_is_three_quarters() {
        let cfg = MmConfig::new(8 << 20).swap(usermm::SwapConfig::Ram { size: 24 << 20 });
        let p = swap_w_seq(&cfg, 2, true).unwrap();
        assert_eq!(p.bytes_per_task, 12 << 20);
        assert!(!p.readonly);
    }

    #[test]
    fn anon_r_seq_is_pte_limit_over_tasks() {
        let cfg = MmConfig::new(256 << 20);
        let p = anon_r_seq(&cfg, 2, None, true).unwrap();
        assert_eq!(p.bytes_per_task, 32 << 30);
        assert!(p.readonly);
        let p = anon_r_seq(&cfg, 1, Some(1 << 50), true).unwrap();
        assert_eq!(p.bytes_per_task, AS_LIMIT);
        let p = anon_r_seq(&cfg, 3, Some(100 << 20), false).unwrap();
        assert_eq!(p.bytes_per_task, ((100 << 20) / 3) & !4095);
        assert!(anon_r_seq(&cfg, 4, Some(4096), true).is_err());
    }

    #[test]
    fn usemem_rounds_and_checks() {
        let p = usemem("13", 13, 1, false, 1, false, 1, true).unwrap();
        assert_eq!((p.bytes_per_task, p.step), (8, 8));
        assert!(usemem("4", 4, 1, false, 8, false, 1, true).is_err());
        assert!(usemem("8", 8, 0, false, 8, false, 1, true).is_err());
        assert!(usemem("8", 8, MAX_TASKS + 1, false, 8, false, 1, true).is_err());
        assert!(usemem("8", 8, MAX_TASKS, false, 8, false, 1, true).is_ok());
    }
}

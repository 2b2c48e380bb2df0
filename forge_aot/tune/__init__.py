"""Stage 3 of the build: tuning (between plan and compile).

``forge-aot tune`` measures every manifest entry (kernel × variant × table row) on the local GPUs into the
tuning database (``database``); ``forge-aot build`` fills the tables from it (``apply``). The parts: the
candidates of a row (``candidates``), the timing method (``timing``), search strategies over one base
(``search``), the GPU benchmark worker process (``bench_worker``), the run that ties them (``runner``) and
its report (``report``).
"""

<?php
// A worker script for corral's native PHP worker (worker_script = ".../worker.php"): the
// application boots once, then every request runs $handler. Anything built before the loop
// (here a tiny "container") lives as long as the worker process; the superglobals, headers,
// status and output are fresh for each request.

final class Greeter
{
    public static int $requests = 0;

    public function __construct(private string $greeting) {}

    public function greet(string $who): string
    {
        return "{$this->greeting}, {$who}";
    }
}

$greeter = new Greeter('Hello'); // the boot: load classes, read config, build services

$handler = static function () use ($greeter): void {
    Greeter::$requests++;
    header('Content-Type: text/plain; charset=utf-8');
    $who = $_GET['name'] ?? 'world';
    echo $greeter->greet($who), "\n";
    echo 'requests served by this worker: ', Greeter::$requests, "\n";
};

// corral_handle_request() returns false when corral stops the worker.
while (corral_handle_request($handler)) {
    gc_collect_cycles();
}

# A hello-world Rack app for corral's embedded Rack launcher (conf/rack.toml runs it):
#   [pools.rack]
#   app = "rack:config.ru"
#   cwd = "/path/to/examples/rack"
# corral starts `ruby corral-rack.rb config.ru` with the pool's socket on fd 0 and speaks
# LSAPI to it; `curl http://127.0.0.1:8080/` then answers from here.

hello = lambda do |env|
  rack = defined?(Rack.release) ? "Rack #{Rack.release}" : 'Rack'
  body = "Hello from #{rack} on Ruby #{RUBY_VERSION}, worker #{Process.pid}\n" \
         "You asked for #{env['SCRIPT_NAME']}#{env['PATH_INFO']}\n"
  [200, { 'content-type' => 'text/plain; charset=utf-8',
          'content-length' => body.bytesize.to_s }, [body]]
end

run hello

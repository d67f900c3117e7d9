# frozen_string_literal: true

# corral's Rack launcher: serves one Rack application over LSAPI on the listening socket
# corral hands over as fd 0, one connection at a time and on it any number of sequential
# requests, with only Ruby's standard library (plus the rack gem to read config.ru when it
# is installed).
#
#     ruby corral-rack.rb path/to/config.ru
#     ruby corral-rack.rb path/to/config.ru --preload
#
# Per request corral sends one BEGIN_REQUEST packet (the CGI variables as env pairs, the HTTP
# headers through the known-header index and the unknown-header table) followed by exactly
# the announced number of raw body bytes. This side answers REQ_RECEIVED once the packet is
# parsed, then RESP_HEADER, RESP_STREAM packets of at most 16 KiB and RESP_END, with every
# integer in the byte order the request used. SIGTERM and SIGINT finish the request in
# progress and exit 0. Bad LSAPI input closes that connection and is logged on stderr (which
# corral copies into its own log); the launcher keeps serving. SIGUSR2 writes every thread's
# backtrace to stderr, then the line `corral-stacks: end of pid PID`: corral asks for it before
# it kills a worker past request_timeout and when a request passes slow_threshold
# (ARCHITECTURE.md, "Stacks of a stuck worker").
#
# With --preload, fd 0 is instead a SOCK_SEQPACKET control socket to corral and this process is
# the pool's preloader (ARCHITECTURE.md, "Preload and fork"): it loads the app once, says
# `ready PID`, and for each `fork KEY` message (carrying the worker's listening socket by
# SCM_RIGHTS) forks a worker that serves that socket as above, answering `forked KEY PID`; it
# reaps its workers and reports `exited PID code N` or `exited PID signal N`. It exits when
# corral closes the control socket or on SIGTERM.

require 'rbconfig'
require 'socket'
# Rack::Lint (rack 2.2) calls URI.parse without requiring uri; servers usually have it loaded.
require 'uri'
require 'stringio'
require 'tempfile'

module CorralRack
  # Packet types (lsapidef.h).
  BEGIN_REQUEST = 1
  ABORT_REQUEST = 2
  RESP_HEADER = 3
  RESP_STREAM = 4
  RESP_END = 5
  REQ_RECEIVED = 7

  PACKET_HEADER_LEN = 8
  REQ_HEADER_LEN = 44
  HEADER_INDEX_LEN = 152
  UNKNOWN_ENTRY_LEN = 16
  # lsphp refuses a BEGIN_REQUEST or RESP_HEADER over this size.
  MAX_HEADER_PACKET = 65_535
  # Largest RESP_STREAM payload (LSAPI_MAX_DATA_PACKET_LEN).
  MAX_DATA = 16_384
  MAX_ENV_PAIRS = 8192
  MAX_RESP_HEADERS = 1000
  # Longest response header line; its length travels as an int16.
  MAX_HEADER_LINE = 32_766
  # m_reqBodyLen value meaning "2 GiB or more, read Content-Length".
  BODY_LEN_FROM_CONTENT_LENGTH = -2
  # Bodies above this go to a temporary file instead of memory.
  MEMORY_BODY = 1 << 20
  CHUNK = 64 * 1024

  # The known-header index, slot by slot, as CGI variables. Slot 24 (Transfer-Encoding) is
  # skipped, as lsphp does: the body always arrives with its length.
  KNOWN_HEADERS = %w[
    HTTP_ACCEPT HTTP_ACCEPT_CHARSET HTTP_ACCEPT_ENCODING HTTP_ACCEPT_LANGUAGE
    HTTP_AUTHORIZATION HTTP_CONNECTION CONTENT_TYPE CONTENT_LENGTH HTTP_COOKIE HTTP_COOKIE2
    HTTP_HOST HTTP_PRAGMA HTTP_REFERER HTTP_USER_AGENT HTTP_CACHE_CONTROL
    HTTP_IF_MODIFIED_SINCE HTTP_IF_MATCH HTTP_IF_NONE_MATCH HTTP_IF_RANGE
    HTTP_IF_UNMODIFIED_SINCE HTTP_KEEP_ALIVE HTTP_RANGE HTTP_X_FORWARDED_FOR HTTP_VIA
  ].map(&:freeze).freeze

  HOP_BY_HOP = %w[
    connection keep-alive proxy-authenticate proxy-authorization te trailer
    transfer-encoding upgrade
  ].freeze
  HEADER_NAME = /\A[!#$%&'*+.^_`|~0-9A-Za-z-]+\z/.freeze
  HEADER_VALUE = /\A[^\x00-\x08\x0a-\x1f\x7f]*\z/n.freeze

  ERROR_BODY = "Internal Server Error\n"

  # Whether the LiteSpeed library built for this machine reads flag 0 as little-endian
  # (x86 and big-endian CPUs) or, on other little-endian CPUs, as big-endian.
  NATIVE_BIG = [1].pack('S') == [1].pack('S>')
  LITERAL_FLAG = NATIVE_BIG || RbConfig::CONFIG['host_cpu'].to_s.match?(/\A(x86_64|amd64|i[3-6]86|x86)\z/)

  def self.log(message)
    $stderr.write("corral-rack: #{message}\n")
  rescue IOError, SystemCallError
    nil
  end

  # corral asks for a worker's stacks with this signal (src/process/stacks.rs) and reads them
  # from stderr up to the end line.
  STACK_SIGNAL = 'USR2'

  # Makes STACK_SIGNAL write every thread's backtrace on stderr, then the end line. The trap
  # runs on the main thread between Ruby operations: a `sleep` or a blocking read is
  # interrupted for it and then resumed. Set before the app is loaded, so a hung load can be
  # asked too; forked workers inherit it and name their own pid.
  def self.install_stack_dump
    Signal.trap(STACK_SIGNAL) do
      # The frames below this block are the interrupted code's: the current thread's
      # backtrace is cut to them, so its first line is where the app was.
      interrupted = caller(0).size - 1
      text = +''
      Thread.list.each do |t|
        frames = Array(t.backtrace)
        frames = frames.last(interrupted) if t == Thread.current
        text << "Thread #{t.inspect}#{t == Thread.main ? ' (main)' : ''}:\n"
        frames.each { |frame| text << "  #{frame}\n" }
      end
      text << "corral-stacks: end of pid #{Process.pid}\n"
      $stderr.write(text)
    rescue IOError, SystemCallError
      nil
    end
  rescue ArgumentError => e
    log("cannot install the stack dump on SIGUSR2: #{e.message}")
  end

  # The peer broke an LSAPI rule: the connection is closed without an answer.
  class BadRequest < StandardError; end

  # corral closed the connection while the response was being written.
  class PeerGone < StandardError; end

  # The integer formats of one byte order.
  class Order
    attr_reader :flag

    def initialize(big, flag)
      @i32 = big ? 'l>' : 'l<'
      @u16 = big ? 'S>' : 'S<'
      # The nine int32 of the request header after the packet header, and the known-header
      # index (24 lengths, slot 24's length and the padding, 24 offsets), each in one
      # unpack rather than a byteslice and an unpack per number.
      @fields = "#{@i32}9"
      @index = "#{@u16}#{KNOWN_HEADERS.size}x4#{@i32}#{KNOWN_HEADERS.size}"
      @flag = flag
    end

    def fields(bytes)
      bytes.unpack(@fields, offset: PACKET_HEADER_LEN)
    end

    # [lengths, offsets] of the known headers; the caller checked the index lies inside.
    def index(bytes, at)
      all = bytes.unpack(@index, offset: at)
      [all.first(KNOWN_HEADERS.size), all.last(KNOWN_HEADERS.size)]
    end

    def i32(bytes, at)
      bytes.byteslice(at, 4).unpack1(@i32)
    end

    def u16(bytes, at)
      bytes.byteslice(at, 2).unpack1(@u16)
    end

    def pack_i32(*values)
      values.pack("#{@i32}*")
    end

    def pack_u16(values)
      values.pack("#{@u16}*")
    end

    # The 8-byte packet header.
    def packet(type, len)
      ['LS', type, @flag].pack('a2 C C') + pack_i32(len)
    end

    def self.of_flag(flag)
      big = (flag & 1 == 1) == LITERAL_FLAG
      new(big, flag & 1)
    end
  end

  # One parsed BEGIN_REQUEST.
  Request = Struct.new(:order, :env, :body_len, :number)

  # Reads and checks one BEGIN_REQUEST: every length and offset is bounded by the packet
  # before anything is sliced.
  class Parser
    # nil when the peer closed cleanly between requests (or only probed the socket).
    def self.read(io)
      head = io.read(PACKET_HEADER_LEN)
      return nil if head.nil?
      raise BadRequest, "connection closed inside a packet header (#{head.bytesize} of 8 bytes)" if head.bytesize < PACKET_HEADER_LEN
      raise BadRequest, "packet magic is #{head.byteslice(0, 2).inspect}, not \"LS\"" unless head.start_with?('LS')

      type = head.getbyte(2)
      order = Order.of_flag(head.getbyte(3))
      len = order.i32(head, 4)
      return nil if type == ABORT_REQUEST && len == PACKET_HEADER_LEN # the server gives up: close
      raise BadRequest, "packet type #{type} is not BEGIN_REQUEST (1)" unless type == BEGIN_REQUEST
      unless len >= REQ_HEADER_LEN + 8 + HEADER_INDEX_LEN && len <= MAX_HEADER_PACKET
        raise BadRequest, "BEGIN_REQUEST length #{len} is outside #{REQ_HEADER_LEN + 8 + HEADER_INDEX_LEN}..#{MAX_HEADER_PACKET}"
      end

      rest = io.read(len - PACKET_HEADER_LEN)
      got = rest ? rest.bytesize : 0
      raise BadRequest, "connection closed inside BEGIN_REQUEST (#{got + 8} of #{len} bytes)" if got < len - PACKET_HEADER_LEN

      new(head + rest, order).parse
    end

    def initialize(packet, order)
      @p = packet
      @o = order
      @len = packet.bytesize
    end

    def parse
      fields = @o.fields(@p)
      header_len, body_len, *offsets, unknown, env_count, special_count = fields
      names = %w[scriptFile scriptName queryString requestMethod]
      offsets.zip(names).each do |off, name|
        raise BadRequest, "m_#{name}Off #{off} is outside the #{@len}-byte packet" unless off >= 0 && off < @len
      end
      raise BadRequest, "m_httpHeaderLen #{header_len} is negative" if header_len.negative?
      raise BadRequest, "m_reqBodyLen #{body_len} is negative" if body_len.negative? && body_len != BODY_LEN_FROM_CONTENT_LENGTH
      [[special_count, 'special env'], [env_count, 'env']].each do |count, what|
        raise BadRequest, "#{what} pair count #{count} is outside 0..#{MAX_ENV_PAIRS}" unless count.between?(0, MAX_ENV_PAIRS)
      end
      raise BadRequest, "unknown header count #{unknown} is negative" if unknown.negative?

      at = REQ_HEADER_LEN
      _special, at = pairs(at, special_count, 'special env')
      env_pairs, at = pairs(at, env_count, 'env')
      at = (at + 7) & ~7
      index_at = at
      table_at = index_at + HEADER_INDEX_LEN
      head_at = table_at + unknown * UNKNOWN_ENTRY_LEN
      if head_at + header_len != @len
        raise BadRequest, "BEGIN_REQUEST sections end at #{head_at + header_len}, packet length is #{@len}"
      end

      env = {}
      env_pairs.each { |k, v| env[k] = v }
      headers(env, index_at, table_at, unknown, head_at, header_len)
      length = body_len
      if length == BODY_LEN_FROM_CONTENT_LENGTH
        declared = env['CONTENT_LENGTH'].to_s
        raise BadRequest, "m_reqBodyLen is -2 but Content-Length #{declared.inspect} is not a number" unless declared.match?(/\A[0-9]{1,19}\z/)

        length = declared.to_i
      end
      Request.new(@o, env, length)
    end

    private

    # `count` env pairs from `at`, then the four-zero-byte terminator.
    def pairs(at, count, what)
      list = []
      count.times do |i|
        need(at, 4, "#{what} pair #{i} lengths")
        key_len = @p.byteslice(at, 2).unpack1('n')
        val_len = @p.byteslice(at + 2, 2).unpack1('n')
        raise BadRequest, "#{what} pair #{i} has a zero length (lengths count the NUL)" if key_len.zero? || val_len.zero?

        at += 4
        need(at, key_len + val_len, "#{what} pair #{i}")
        key = @p.byteslice(at, key_len)
        value = @p.byteslice(at + key_len, val_len)
        raise BadRequest, "#{what} pair #{i} is not NUL-terminated" unless key.end_with?("\0") && value.end_with?("\0")

        key = key.chop
        raise BadRequest, "#{what} pair #{i} has an empty name" if key.empty?

        list << [key, value.chop]
        at += key_len + val_len
      end
      need(at, 4, "#{what} list terminator")
      raise BadRequest, "#{what} list is not ended by four zero bytes" unless @p.byteslice(at, 4) == "\0\0\0\0"

      [list, at + 4]
    end

    def need(at, n, what)
      raise BadRequest, "#{what} (#{n} bytes at #{at}) runs past the #{@len}-byte packet" if at + n > @len
    end

    # Known headers from the index, unknown ones from the table, as CGI variables.
    def headers(env, index_at, table_at, unknown, head_at, header_len)
      head = @p.byteslice(head_at, header_len)
      lens, offs = @o.index(@p, index_at)
      KNOWN_HEADERS.each_with_index do |name, i|
        off = offs[i]
        next if off.zero?

        len = lens[i]
        check_span(off, len, header_len, "known header #{i} value")
        add_header(env, name, head.byteslice(off, len))
      end
      unknown.times do |i|
        name_off, name_len, value_off, value_len = (0...4).map { |f| @o.i32(@p, table_at + 16 * i + 4 * f) }
        check_span(name_off, name_len, header_len, "unknown header #{i} name")
        check_span(value_off, value_len, header_len, "unknown header #{i} value")
        raise BadRequest, "unknown header #{i} has an empty name" if name_len.zero?

        name = "HTTP_#{head.byteslice(name_off, name_len).upcase.tr('-', '_')}"
        # Never let a header pose as the entity variables Rack reserves.
        next if %w[HTTP_CONTENT_TYPE HTTP_CONTENT_LENGTH].include?(name)

        add_header(env, name, head.byteslice(value_off, value_len))
      end
    end

    def check_span(off, len, limit, what)
      return if off.positive? && len >= 0 && off + len <= limit

      raise BadRequest, "#{what} at #{off}, #{len} bytes, is outside the #{limit}-byte header block"
    end

    def add_header(env, name, value)
      old = env[name]
      env[name] = if old.nil? then value
                  elsif name == 'HTTP_COOKIE' then "#{old}; #{value}"
                  else "#{old}, #{value}"
                  end
    end
  end

  # The Rack 3 streaming body's stream argument: writes become RESP_STREAM packets.
  class Stream
    def initialize(writer)
      @writer = writer
      @closed = false
    end

    def write(data)
      @writer.body(data.to_s)
      data.to_s.bytesize
    end

    def <<(data)
      write(data)
      self
    end

    def flush
      @writer.flush
      self
    end

    def read(*)
      nil
    end

    def close_read; end

    def close_write
      @closed = true
    end

    def close
      @closed = true
    end

    def closed?
      @closed
    end
  end

  # Writes the response packets of one request. Packets wait in a queue until a flush: the
  # head goes out with the first body chunk, and an Array body goes out whole together with
  # RESP_END (up to FLUSH_AT bytes per write), so a small response is one write.
  class Writer
    FLUSH_AT = 64 * 1024

    def initialize(io, order)
      @io = io
      @o = order
      @out = []
      @queued = 0
      @head_queued = false
      @started = false
    end

    # Whether RESP_HEADER has left: until then an error can still become a 500.
    def started?
      @started
    end

    # Forgets the queued packets (a response that failed before anything of it was sent).
    def discard
      @out = []
      @queued = 0
    end

    # REQ_RECEIVED goes out at once: from here on corral must not retry the request.
    def received
      queue(@o.packet(REQ_RECEIVED, PACKET_HEADER_LEN))
      flush
    end

    # RESP_HEADER: int32 count, int32 status, int16 length of each line (NUL included), the
    # NUL-terminated lines.
    def head(status, lines)
      raise ArgumentError, "#{lines.size} response headers, over #{MAX_RESP_HEADERS}" if lines.size > MAX_RESP_HEADERS

      strings = lines.map { |l| "#{l}\0".b }
      payload = @o.pack_i32(lines.size, status) + @o.pack_u16(strings.map(&:bytesize)) + strings.join
      total = PACKET_HEADER_LEN + payload.bytesize
      raise ArgumentError, "response headers take #{total} bytes, over #{MAX_HEADER_PACKET}" if total > MAX_HEADER_PACKET

      queue(@o.packet(RESP_HEADER, total), payload)
      @head_queued = true
    end

    # RESP_STREAM packets of at most 16 KiB; sent now unless `now` is false.
    def body(data, now: true)
      data = data.b
      at = 0
      while at < data.bytesize
        part = data.byteslice(at, MAX_DATA)
        queue(@o.packet(RESP_STREAM, PACKET_HEADER_LEN + part.bytesize), part)
        at += part.bytesize
      end
      flush if now || @queued >= FLUSH_AT
    end

    def finish
      queue(@o.packet(RESP_END, PACKET_HEADER_LEN))
      flush
    end

    def flush
      return if @out.empty?

      parts = @out
      @out = []
      @queued = 0
      @started ||= @head_queued
      @io.write(*parts)
    rescue IOError, SystemCallError => e
      raise PeerGone, e.message
    end

    private

    def queue(*parts)
      @out.concat(parts)
      @queued += parts.sum(&:bytesize)
    end
  end

  # Turns a Rack response into status and header lines, or raises ArgumentError.
  def self.response_lines(status, headers)
    code = Integer(status)
    raise ArgumentError, "status #{status.inspect} is not 100..999" unless code.between?(100, 999)

    lines = []
    headers.each do |name, value|
      name = name.to_s
      raise ArgumentError, "header name #{name.inspect} is not an HTTP token" unless HEADER_NAME.match?(name)

      down = name.downcase
      next if down == 'status' || down.start_with?('rack.')

      # Rack 3: an Array of values; Rack 2: one String, "\n" between values.
      values = value.is_a?(Array) ? value : value.to_s.split("\n")
      values = [''] if values.empty? && !value.is_a?(Array)
      if HOP_BY_HOP.include?(down)
        log("dropped hop-by-hop header #{name}: #{values.join(', ')} (the gateway owns the connection)")
        next
      end
      values.each do |v|
        v = v.to_s.b
        raise ArgumentError, "header #{name} has a value with a control character" unless HEADER_VALUE.match?(v)

        line = "#{name}: ".b + v
        raise ArgumentError, "header #{name} is longer than #{MAX_HEADER_LINE} bytes" if line.bytesize > MAX_HEADER_LINE

        lines << line
      end
    end
    [code, lines]
  end

  # Serves requests on one connection until the peer closes it or something breaks.
  class Connection
    def initialize(server, io)
      @server = server
      @io = io
      @served = 0
    end

    def serve
      loop do
        @server.state = :idle
        return if @server.stopping

        request = Parser.read(@io)
        return if request.nil?

        @server.state = :busy
        request.number = (@served += 1)
        writer = Writer.new(@io, request.order)
        writer.received
        input = read_body(request.body_len)
        begin
          keep = @server.handle(request, input, writer)
        ensure
          input.close! if input.respond_to?(:close!)
        end
        return unless keep
      end
    rescue BadRequest => e
      CorralRack.log("bad LSAPI request, connection closed: #{e.message}")
    rescue PeerGone => e
      CorralRack.log("connection closed by corral while answering (#{e.message})")
    rescue IOError, SystemCallError => e
      CorralRack.log("connection failed: #{e.class}: #{e.message}")
    end

    private

    # Exactly `len` raw bytes: a StringIO up to 1 MiB, a temporary file above.
    def read_body(len)
      return StringIO.new(''.b) if len.zero?

      if len <= MEMORY_BODY
        data = @io.read(len)
        short!(data ? data.bytesize : 0, len) if data.nil? || data.bytesize < len
        return StringIO.new(data)
      end
      file = Tempfile.new('corral-rack-body')
      file.binmode
      file.unlink
      left = len
      buf = ''.b
      while left.positive?
        data = @io.read([left, CHUNK].min, buf)
        if data.nil?
          file.close
          short!(len - left, len)
        end
        file.write(data)
        left -= data.bytesize
      end
      file.rewind
      file
    end

    def short!(got, len)
      raise BadRequest, "connection closed inside the body (#{got} of #{len} bytes)"
    end
  end

  # The accept loop, the Rack env and the call into the app.
  class Server
    attr_accessor :state
    attr_reader :stopping

    def initialize(app, rack_version)
      @app = app
      @rack_version = rack_version
      @state = :idle
      @stopping = false
    end

    def trap_signals
      %w[TERM INT].each do |sig|
        Signal.trap(sig) do
          @stopping = true
          # Waiting for a connection or for the next request: nothing to finish.
          exit(0) if @state == :idle
        end
      end
    end

    def run(socket)
      if listening?(socket)
        until @stopping
          begin
            conn, = socket.accept
          rescue IOError, SystemCallError => e
            # Out of descriptors or an aborted handshake: log, breathe, try again.
            CorralRack.log("accept failed: #{e.class}: #{e.message}")
            sleep 0.1
            next
          end
          serve(conn)
        end
      else
        serve(socket)
      end
    end

    def serve(conn)
      conn.binmode
      conn.sync = true
      Connection.new(self, conn).serve
    ensure
      @state = :idle
      conn.close unless conn.closed?
      exit(0) if @stopping
    end

    # Calls the app and writes its answer; true when the connection can carry another
    # request.
    def handle(request, input, writer)
      env = rack_env(request, input)
      status, headers, body = nil
      begin
        # corral asking whether the app is loaded (it is: requests are served only once it
        # is), before the worker gets traffic. The app is not called.
        status, headers, body = if env['CORRAL_READY_PROBE'] == '1'
                                  [204, {}, []]
                                else
                                  @app.call(env)
                                end
        code, lines = CorralRack.response_lines(status, headers)
      rescue StandardError, ScriptError, SystemStackError => e
        report(env, e)
        close_body(body)
        error_response(writer)
        finished(env, nil, nil, e)
        return true
      end
      error = nil
      begin
        writer.head(code, lines)
        write_body(body, writer)
        writer.finish
        true
      rescue PeerGone
        raise
      rescue StandardError, ScriptError, SystemStackError => e
        error = e
        report(env, e)
        # Nothing sent yet: the answer can still be a 500. Once the head is out, closing
        # the connection is all that is left to say.
        reusable = !writer.started?
        if reusable
          writer.discard
          error_response(writer)
        end
        reusable
      ensure
        close_body(body)
        finished(env, code, headers, error)
      end
    end

    private

    def listening?(socket)
      socket.getpeername
      false
    rescue Errno::ENOTCONN, Errno::EINVAL
      true
    end

    # Each chunk of a streaming body is sent as soon as it is yielded; an Array body is
    # complete already and leaves with RESP_END.
    def write_body(body, writer)
      if body.respond_to?(:each)
        now = !body.is_a?(Array)
        body.each do |chunk|
          raise TypeError, "the body yielded #{chunk.class}, not String" unless chunk.is_a?(String)

          writer.body(chunk, now: now) unless chunk.empty?
        end
      elsif body.respond_to?(:call)
        writer.flush
        body.call(Stream.new(writer))
      else
        raise TypeError, "the body #{body.class} responds to neither each nor call"
      end
    end

    def close_body(body)
      body.close if body.respond_to?(:close)
    rescue StandardError, ScriptError => e
      CorralRack.log("the body's close raised #{e.class}: #{e.message}\n\t#{Array(e.backtrace).join("\n\t")}")
    end

    def finished(env, status, headers, error)
      callbacks = env['rack.response_finished']
      return unless callbacks.is_a?(Array)

      callbacks.reverse_each do |callback|
        callback.call(env, status, headers, error)
      rescue StandardError => e
        CorralRack.log("a rack.response_finished callback raised #{e.class}: #{e.message}")
      end
    end

    def error_response(writer)
      writer.head(500, ['Content-Type: text/plain; charset=utf-8', "Content-Length: #{ERROR_BODY.bytesize}"])
      writer.body(ERROR_BODY, now: false)
      writer.finish
    end

    def report(env, error)
      uri = "#{env['SCRIPT_NAME']}#{env['PATH_INFO']}"
      uri += "?#{env['QUERY_STRING']}" unless env['QUERY_STRING'].to_s.empty?
      trace = Array(error.backtrace).join("\n\t")
      CorralRack.log("#{env['REQUEST_METHOD']} #{uri}: the application raised #{error.class}: #{error.message}\n\t#{trace}")
    end

    def rack_env(request, input)
      env = request.env
      env['REQUEST_METHOD'] = 'GET' if env['REQUEST_METHOD'].to_s.empty?
      env['QUERY_STRING'] ||= +''
      env['SERVER_PROTOCOL'] = 'HTTP/1.1' unless env['SERVER_PROTOCOL'].to_s.start_with?('HTTP/')
      https = env['HTTPS'].to_s.downcase
      scheme = %w[on 1 yes].include?(https) ? 'https' : 'http'
      host, port = split_host(env['HTTP_HOST'].to_s)
      env['SERVER_NAME'] = host || 'localhost' if env['SERVER_NAME'].to_s.empty?
      env['SERVER_PORT'] = port || (scheme == 'https' ? '443' : '80') unless env['SERVER_PORT'].to_s.match?(/\A[0-9]+\z/)
      paths(env)
      if request.body_len.positive? || env.key?('CONTENT_LENGTH')
        env['CONTENT_LENGTH'] = request.body_len.to_s
      end
      env.delete('CONTENT_TYPE') if env['CONTENT_TYPE'] == ''
      env['rack.version'] = @rack_version if @rack_version
      env['rack.url_scheme'] = scheme
      env['rack.input'] = input
      env['rack.errors'] = $stderr
      env['rack.multithread'] = false
      env['rack.multiprocess'] = true
      env['rack.run_once'] = false
      env['rack.hijack?'] = false
      env['rack.response_finished'] = []
      # How many requests this LSAPI connection has carried, this one included: above 1
      # when corral reuses its persistent connection.
      env['corral.connection_requests'] = request.number
      env
    end

    # Rack: SCRIPT_NAME is "" at the root, never "/"; PATH_INFO is "" or starts with "/".
    def paths(env)
      script = env['SCRIPT_NAME'].to_s
      path = env.key?('PATH_INFO') ? env['PATH_INFO'].to_s : derived_path(env, script)
      if script.end_with?('/')
        script = script.sub(%r{/+\z}, '')
        path = "/#{path.sub(%r{\A/+}, '')}"
      end
      path = "/#{path}" unless path.empty? || path.start_with?('/')
      path = '/' if script.empty? && path.empty?
      env['SCRIPT_NAME'] = script
      env['PATH_INFO'] = path
    end

    def derived_path(env, script)
      path = env['REQUEST_URI'].to_s.split('?', 2).first.to_s
      path.start_with?(script) ? path.byteslice(script.bytesize..) : path
    end

    def split_host(host)
      return [nil, nil] if host.empty?
      return [Regexp.last_match(1), Regexp.last_match(2)] if host =~ /\A(\[[^\]]*\]|[^:]*)(?::([0-9]+))?\z/

      [nil, nil]
    end
  end

  # config.ru without the rack gem: `run`, `use`, `map` and `warmup`, as Rack::Builder has.
  class MiniBuilder
    def self.parse_file(path)
      text = File.read(path).sub(/^__END__\n.*\z/m, '')
      builder = new
      builder.instance_eval(text, path, 1)
      builder.to_app
    end

    def initialize
      @use = []
      @map = {}
      @run = nil
    end

    def use(middleware, *args, **opts, &block)
      @use << ->(app) { middleware.new(app, *args, **opts, &block) }
    end

    def run(app = nil, &block)
      @run = app || block
    end

    def map(prefix, &block)
      sub = MiniBuilder.new
      sub.instance_eval(&block)
      @map[prefix.chomp('/')] = sub.to_app
    end

    def warmup(prc = nil, &block)
      @warmup = prc || block
    end

    def to_app
      app = @map.empty? ? @run : mapper
      raise ArgumentError, 'config.ru has no run statement' if app.nil?

      app = @use.reverse.inject(app) { |a, wrap| wrap.call(a) }
      @warmup&.call(app)
      app
    end

    private

    def mapper
      maps = @map.sort_by { |prefix, _| -prefix.size }
      fallback = @run
      lambda do |env|
        path = env['PATH_INFO'].to_s
        prefix, app = maps.find { |p, _| path == p || path.start_with?("#{p}/") || p.empty? }
        if app
          env = env.merge('SCRIPT_NAME' => env['SCRIPT_NAME'].to_s + prefix, 'PATH_INFO' => path.byteslice(prefix.bytesize..))
          return app.call(env)
        end
        return fallback.call(env) if fallback

        [404, { 'content-type' => 'text/plain' }, ["Not Found\n"]]
      end
    end
  end

  # Bundler's setup, before anything of the app (rack included) is loaded, when the app has
  # a bundle: BUNDLE_GEMFILE from the pool's env, else a Gemfile (or gems.rb) next to the
  # rackup file, as Passenger and `bundle exec rackup` find it. Only the bundle's gems, in
  # the locked versions, can then be loaded; a gem it lacks fails here, naming the gem.
  # Returns the Gemfile used, or nil.
  def self.bundle(rackup)
    gemfile = ENV['BUNDLE_GEMFILE'].to_s
    if gemfile.empty?
      dir = File.dirname(File.expand_path(rackup))
      gemfile = %w[Gemfile gems.rb].map { |name| File.join(dir, name) }.find { |f| File.file?(f) }
      return nil if gemfile.nil?

      ENV['BUNDLE_GEMFILE'] = gemfile
    end
    require 'bundler/setup'
    gemfile
  end

  # The app and the rack.version to announce (rack 2 wants one; rack 3 dropped it).
  def self.load_app(path)
    begin
      require 'rack'
    rescue LoadError
      return [MiniBuilder.parse_file(path), [1, 3]]
    end
    # rack 2 returns [app, options], rack 3 the app alone.
    result = Rack::Builder.parse_file(path)
    app = result.is_a?(Array) ? result.first : result
    major = Rack.respond_to?(:release) ? Rack.release.to_i : 2
    [app, major < 3 && defined?(Rack::VERSION) ? Rack::VERSION : nil]
  end

  # Preload and fork: the preloader's side of the control socket.
  module Preloader
    # Longest control message either way; corral's are a few bytes.
    MAX_CONTROL = 256
    PR_SET_PDEATHSIG = 1

    # SIGKILL this worker when the preloader (its parent) dies, so no worker outlives the
    # process corral tracks it through; a worker whose parent is already gone exits.
    def self.parent_death_signal(parent)
      require 'fiddle'
      prctl = Fiddle::Function.new(
        Fiddle::Handle::DEFAULT['prctl'],
        [Fiddle::TYPE_INT, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG],
        Fiddle::TYPE_INT
      )
      prctl.call(PR_SET_PDEATHSIG, Signal.list.fetch('KILL'), 0, 0, 0)
    rescue LoadError, Fiddle::DLError, KeyError => e
      CorralRack.log("cannot set the parent-death signal: #{e.message}")
    ensure
      exit!(1) if Process.ppid != parent
    end

    def self.exit_text(status)
      status.signaled? ? "signal #{status.termsig}" : "code #{status.exitstatus}"
    end

    # Reports every worker that ended.
    def self.reap(control)
      loop do
        pid, status = Process.wait2(-1, Process::WNOHANG)
        return if pid.nil?

        control.sendmsg("exited #{pid} #{exit_text(status)}")
      end
    rescue Errno::ECHILD
      nil
    end

    # Forks one worker serving the listening socket `listener`; returns its pid.
    def self.fork_worker(app, version, control, wake, listener)
      parent = Process.pid
      pid = fork do
        # Its own session and process group, as a spawned worker has: corral signals the
        # group and sums memory over the worker's own process tree.
        Process.setsid
        parent_death_signal(parent)
        Signal.trap('CHLD', 'DEFAULT')
        control.close
        wake.each(&:close)
        # The preloader's random state must not be every worker's.
        srand
        Random.srand
        CorralRack.log("worker #{Process.pid} forked from preloader #{parent}")
        server = Server.new(app, version)
        server.trap_signals
        # A stop signal that came before the worker's own handlers went to the preloader's
        # (copied by the fork), which only raised its flag.
        exit!(0) if @stopping
        server.run(listener)
        exit!(0)
      end
      listener.close
      pid
    end

    # The preloader's loop: fork workers on request, reap them, report both.
    def self.run(app, version, control)
      wake_r, wake_w = IO.pipe
      @stopping = false
      Signal.trap('CHLD') { wake_w.write_nonblock('.', exception: false) }
      %w[TERM INT].each do |sig|
        Signal.trap(sig) do
          @stopping = true
          wake_w.write_nonblock('.', exception: false)
        end
      end
      control.sendmsg("ready #{Process.pid}")
      until @stopping
        readable, = IO.select([control, wake_r])
        wake_r.read_nonblock(64, exception: false) if readable.include?(wake_r)
        reap(control)
        next unless readable.include?(control) && !@stopping

        msg, _, _, *controls = control.recvmsg(MAX_CONTROL, 0, 256, scm_rights: true)
        ios = controls.flat_map { |c| c.cmsg_is?(:SOCKET, :RIGHTS) ? c.unix_rights : [] }
        if msg.nil? || msg.empty?
          ios.each(&:close)
          CorralRack.log('corral closed the control socket; the preloader exits')
          return
        end
        words = msg.split
        unless words.size == 2 && words[0] == 'fork' && words[1].match?(/\A[0-9]+\z/) && ios.size == 1
          ios.each(&:close)
          CorralRack.log("ignoring a malformed control message (#{msg.bytesize} bytes, #{ios.size} descriptors)")
          next
        end
        listener = Socket.for_fd(ios[0].fileno)
        ios[0].autoclose = false
        pid = fork_worker(app, version, control, [wake_r, wake_w], listener)
        control.sendmsg("forked #{words[1]} #{pid}")
      end
    rescue IOError, SystemCallError => e
      # corral went away mid-message: nothing left to serve.
      CorralRack.log("control socket failed: #{e.class}: #{e.message}")
    end
  end

  # No core dumps, and no ptrace or /proc/PID/mem by other processes of the same user
  # (PR_SET_DUMPABLE 0): another pool's compromised worker running as this user must not
  # read this one's memory or steer it. corral cannot set this for the launcher, since
  # execve makes a process dumpable again; set before the app is loaded, it holds for the
  # preloader and every worker it forks.
  def self.make_undumpable
    require 'fiddle'
    prctl = Fiddle::Function.new(Fiddle::Handle::DEFAULT['prctl'], [Fiddle::TYPE_INT] * 5, Fiddle::TYPE_INT)
    log('cannot make the process non-dumpable') unless prctl.call(4, 0, 0, 0, 0).zero? # PR_SET_DUMPABLE
  rescue LoadError, StandardError => e
    log("cannot make the process non-dumpable: #{e.class}: #{e.message}")
  end

  def self.main(argv)
    make_undumpable
    install_stack_dump
    preloading = argv.size == 2 && argv[1] == '--preload'
    if argv.size != 1 && !preloading
      warn 'usage: corral-rack.rb path/to/config.ru [--preload] (listening or control socket on fd 0)'
      return 2
    end
    $stdout.sync = true
    $stderr.sync = true
    # Keep the socket off fd 0 and give fd 0 /dev/null, so an app that reads stdin cannot
    # steal bytes from the socket.
    fd0 = Socket.for_fd(0)
    fd0.autoclose = false
    socket = fd0.dup
    $stdin.reopen(File::NULL)
    begin
      gemfile = bundle(argv[0])
      app, version = load_app(argv[0])
    rescue StandardError, ScriptError => e
      log("cannot load #{argv[0]}: #{e.class}: #{e.message}\n\t#{Array(e.backtrace).join("\n\t")}")
      return 1
    end
    rack = defined?(Rack.release) ? "rack #{Rack.release}" : 'no rack gem'
    bundled = gemfile ? ", bundle #{gemfile}" : ''
    unless preloading
      # Traps first: a SIGTERM sent as soon as the log says "serving" finds them set.
      server = Server.new(app, version)
      server.trap_signals
    end
    log("#{preloading ? 'preloaded' : 'serving'} #{argv[0]} (Ruby #{RUBY_VERSION} at #{RbConfig.ruby}, #{rack}#{bundled}, pid #{Process.pid})")
    if preloading
      Preloader.run(app, version, socket)
      return 0
    end
    server.run(socket)
    0
  end
end

exit(CorralRack.main(ARGV)) if $PROGRAM_NAME == __FILE__

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
# `ready PID` (after warming the app up with a few GET / marked `X-Corral-Warmup: 1` when the
# pool's env sets CORRAL_RACK_WARMUP: Preloader.warm_up), and for each `fork KEY` message (carrying the worker's listening socket by
# SCM_RIGHTS) forks a worker that serves that socket as above, answering `forked KEY PID`; it
# reaps its workers and reports `exited PID code N` or `exited PID signal N`. It exits when
# corral closes the control socket or on SIGTERM. For a pool with refork_after, `fork KEY`
# carries a second descriptor, the worker's own control socket: when corral writes
# `promote` there and sends SIGURG, the idle worker closes its listener and becomes the
# template on that socket, speaking the same protocol (docs/pools.md, "Reforking").

require 'rbconfig'
require 'io/nonblock'
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
  EMPTY = String.new(encoding: Encoding::BINARY).freeze

  # Whether the LiteSpeed library built for this machine reads flag 0 as little-endian
  # (x86 and big-endian CPUs) or, on other little-endian CPUs, as big-endian.
  NATIVE_BIG = [1].pack('S') == [1].pack('S>')
  LITERAL_FLAG = NATIVE_BIG || RbConfig::CONFIG['host_cpu'].to_s.match?(/\A(x86_64|amd64|i[3-6]86|x86)\z/)

  def self.log(message)
    $stderr.write("corral-rack: #{message}\n")
  rescue IOError, SystemCallError
    nil
  end

  # glibc's malloc_trim(0): gives the kernel back every whole page malloc holds free, in the
  # middle of the heap too. Looked up once; nil where there is no Fiddle or no glibc.
  def self.malloc_trim
    @malloc_trim = lookup_malloc_trim if @malloc_trim.nil?
    @malloc_trim&.call(0)
  end

  def self.lookup_malloc_trim
    require 'fiddle'
    Fiddle::Function.new(Fiddle::Handle::DEFAULT['malloc_trim'], [Fiddle::TYPE_SIZE_T], Fiddle::TYPE_INT)
  rescue LoadError, StandardError
    false # nothing to trim this way
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

  # The CGI name of the header a warm-up request carries (Preloader.warm_up).
  WARMUP_HEADER = 'HTTP_X_CORRAL_WARMUP'

  # The peer broke an LSAPI rule: the connection is closed without an answer.
  class BadRequest < StandardError; end

  # corral closed the connection while the response was being written.
  class PeerGone < StandardError; end

  # Raised out of an idle worker's wait when corral promotes it to be the template
  # (docs/pools.md, "Reforking"). Not a StandardError: no app rescue catches it.
  class Promote < Exception; end # rubocop:disable Lint/InheritException

  # The formats of one byte order, built once: each section of a packet is read with one
  # unpack and each response packet written with one pack, into the connection's buffers.
  class Order
    attr_reader :flag, :head, :offsets, :stream, :received, :resp_end

    def initialize(big, flag)
      i32 = big ? 'l>' : 'l<'
      u16 = big ? 'S>' : 'S<'
      @big = big
      @i32 = i32
      @u16 = u16
      @flag = flag
      # The packet header (magic, type, the flag skipped, length) and the nine int32 of the
      # request header.
      @head = "a2Cx#{i32}10"
      # The known-header index: 24 lengths (read one by one, and only for the headers
      # present: see u16), slot 24's length and the padding, then the 24 offsets.
      @offsets = "x#{2 * KNOWN_HEADERS.size + 4}#{i32}#{KNOWN_HEADERS.size}"
      # A RESP_STREAM packet: its header, then the data.
      @stream = "a2CC#{i32}a*"
      @received = packet(REQ_RECEIVED, PACKET_HEADER_LEN).freeze
      @resp_end = packet(RESP_END, PACKET_HEADER_LEN).freeze
      @heads = {}
    end

    # The unsigned 16-bit number at byte `at` of `buf`.
    def u16(buf, at)
      if @big
        (buf.getbyte(at) << 8) | buf.getbyte(at + 1)
      else
        buf.getbyte(at) | (buf.getbyte(at + 1) << 8)
      end
    end

    # The unknown-header table of `count` entries (four int32 each).
    def table(count)
      "#{@i32}#{4 * count}"
    end

    # A RESP_HEADER packet of `count` lines: its header, line count, status, each line's
    # length and the NUL-terminated lines.
    def head_format(count)
      format = @heads[count]
      return format if format

      format = "a2CC#{@i32}3#{@u16}#{count}#{'Z*' * count}".freeze
      @heads[count] = format if count <= 64
      format
    end

    # The 8-byte packet header.
    def packet(type, len)
      ['LS', type, @flag, len].pack("a2CC#{@i32}")
    end

    def self.of_flag(flag)
      big = (flag & 1 == 1) == LITERAL_FLAG
      new(big, flag & 1)
    end
  end

  ORDERS = [Order.of_flag(0), Order.of_flag(1)].freeze

  # The env lists of a BEGIN_REQUEST with no special env (the usual case), read in one
  # unpack: the special list's terminator, `count` pairs (big-endian key and value lengths,
  # each counting its NUL, read as one 32-bit number: key length << 16 | value length; then
  # the NUL-terminated key and value), the env terminator.
  PAIRS_FORMATS = Hash.new { |h, count| h[count] = "N#{'NZ*Z*' * count}N" }

  def self.pairs_format(count)
    count <= 64 ? PAIRS_FORMATS[count] : "N#{'NZ*Z*' * count}N"
  end

  # One parsed BEGIN_REQUEST.
  Request = Struct.new(:order, :env, :body_len, :number)

  # Reads and checks the BEGIN_REQUESTs of one connection from its buffer: every length and
  # offset is bounded by the packet before anything is sliced. One parser serves all the
  # connection's requests; each gets a new Request. (A Request kept for the connection was
  # measured to cost more than it saves: this Ruby promotes what a long-lived Struct points
  # to straight to the old generation, so every env was kept until a major collection.)
  class Parser
    OFFSET_NAMES = %w[scriptFile scriptName queryString requestMethod].freeze

    # The request whose packet starts at `base` in `buf` (all of its `len` bytes are there);
    # `head`: the packet header's unpack by `order.head` (magic, type, length, then the nine
    # int32 of the request header).
    def parse(buf, base, len, order, head)
      @p = buf
      @b = base
      @len = len
      @o = order
      _, _, _, header_len, body_len, _, _, _, _, unknown, env_count, special_count = head
      i = 5
      while i < 9
        off = head[i]
        raise BadRequest, "m_#{OFFSET_NAMES[i - 5]}Off #{off} is outside the #{len}-byte packet" unless off >= 0 && off < len

        i += 1
      end
      raise BadRequest, "m_httpHeaderLen #{header_len} is negative" if header_len.negative?
      raise BadRequest, "m_reqBodyLen #{body_len} is negative" if body_len.negative? && body_len != BODY_LEN_FROM_CONTENT_LENGTH
      raise BadRequest, "special env pair count #{special_count} is outside 0..#{MAX_ENV_PAIRS}" unless special_count >= 0 && special_count <= MAX_ENV_PAIRS
      raise BadRequest, "env pair count #{env_count} is outside 0..#{MAX_ENV_PAIRS}" unless env_count >= 0 && env_count <= MAX_ENV_PAIRS
      raise BadRequest, "unknown header count #{unknown} is negative" if unknown.negative?

      env = {}
      at = if special_count.zero?
             fast_pairs(env, env_count) || slow_pairs(env, special_count, env_count)
           else
             slow_pairs(env, special_count, env_count)
           end
      index_at = (at + 7) & ~7
      table_at = index_at + HEADER_INDEX_LEN
      head_at = table_at + unknown * UNKNOWN_ENTRY_LEN
      if head_at + header_len != @len
        raise BadRequest, "BEGIN_REQUEST sections end at #{head_at + header_len}, packet length is #{@len}"
      end

      headers(env, index_at, table_at, unknown, head_at, header_len)
      length = body_len
      if length == BODY_LEN_FROM_CONTENT_LENGTH
        declared = env['CONTENT_LENGTH'].to_s
        raise BadRequest, "m_reqBodyLen is -2 but Content-Length #{declared.inspect} is not a number" unless declared.match?(/\A[0-9]{1,19}\z/)

        length = declared.to_i
      end
      Request.new(order, env, length)
    end

    private

    # The env pairs in one unpack; the offset after the env list, or nil when anything in it
    # is amiss (slow_pairs then says what). Z* stops at the first NUL, so a pair whose
    # lengths agree with the strings read has its NULs where its lengths put them, as long
    # as the pairs and the terminator end inside the packet (Z* may run past a pair that
    # lacks its NUL, but then the lengths' sum passes the end).
    def fast_pairs(env, count)
      all = @p.unpack(CorralRack.pairs_format(count), offset: @b + REQ_HEADER_LEN)
      # A terminator read means every field before it was inside the buffer.
      return nil unless all[0] == 0 && all[-1] == 0

      # Each pair takes its 4 length bytes, its strings and their two NULs.
      at = REQ_HEADER_LEN + 4 + 6 * count
      i = 1
      last = 3 * count
      while i < last
        key = all[i + 1]
        value = all[i + 2]
        key_size = key.bytesize
        value_size = value.bytesize
        return nil unless all[i] == (((key_size + 1) << 16) | (value_size + 1)) && key_size.positive?

        env[key] = value
        at += key_size + value_size
        i += 3
      end
      at + 4 <= @len ? at + 4 : nil
    end

    # The special env (checked, then dropped: PHP ini settings and suEXEC control mean
    # nothing here) and the env pairs, pair by pair, saying what is wrong with a bad one.
    def slow_pairs(env, special_count, env_count)
      env.clear
      _special, at = pairs(REQ_HEADER_LEN, special_count, 'special env')
      list, at = pairs(at, env_count, 'env')
      list.each { |k, v| env[k] = v }
      at
    end

    # `count` env pairs from `at`, then the four-zero-byte terminator.
    def pairs(at, count, what)
      list = []
      count.times do |i|
        need(at, 4, "#{what} pair #{i} lengths")
        key_len, val_len = @p.unpack('nn', offset: @b + at)
        raise BadRequest, "#{what} pair #{i} has a zero length (lengths count the NUL)" if key_len.zero? || val_len.zero?

        at += 4
        need(at, key_len + val_len, "#{what} pair #{i}")
        key = slice(at, key_len)
        value = slice(at + key_len, val_len)
        raise BadRequest, "#{what} pair #{i} is not NUL-terminated" unless key.end_with?("\0") && value.end_with?("\0")

        key = key.chop
        raise BadRequest, "#{what} pair #{i} has an empty name" if key.empty?

        list << [key, value.chop]
        at += key_len + val_len
      end
      need(at, 4, "#{what} list terminator")
      raise BadRequest, "#{what} list is not ended by four zero bytes" unless slice(at, 4) == "\0\0\0\0"

      [list, at + 4]
    end

    def slice(at, len)
      @p.byteslice(@b + at, len)
    end

    def need(at, n, what)
      raise BadRequest, "#{what} (#{n} bytes at #{at}) runs past the #{@len}-byte packet" if at + n > @len
    end

    # Known headers from the index, unknown ones from the table, as CGI variables.
    def headers(env, index_at, table_at, unknown, head_at, header_len)
      offsets = @p.unpack(@o.offsets, offset: @b + index_at)
      known = KNOWN_HEADERS.size
      i = 0
      while i < known
        off = offsets[i]
        unless off.zero?
          len = @o.u16(@p, @b + index_at + 2 * i)
          check_span(off, len, header_len, "known header", i, "value")
          add_header(env, KNOWN_HEADERS[i], slice(head_at + off, len))
        end
        i += 1
      end
      return if unknown.zero?

      table = @p.unpack(@o.table(unknown), offset: @b + table_at)
      unknown.times do |j|
        name_off, name_len, value_off, value_len = table[4 * j, 4]
        check_span(name_off, name_len, header_len, "unknown header", j, "name")
        check_span(value_off, value_len, header_len, "unknown header", j, "value")
        raise BadRequest, "unknown header #{j} has an empty name" if name_len.zero?

        name = "HTTP_#{slice(head_at + name_off, name_len).upcase.tr('-', '_')}"
        # Never let a header pose as the entity variables Rack reserves.
        next if name == 'HTTP_CONTENT_TYPE' || name == 'HTTP_CONTENT_LENGTH'

        add_header(env, name, slice(head_at + value_off, value_len))
      end
    end

    # The message names the header as `kind`, `number` and `part`, put together only when
    # the check fails: this runs for every header of every request.
    def check_span(off, len, limit, kind, number, part)
      return if off.positive? && len >= 0 && off + len <= limit

      raise BadRequest, "#{kind} #{number} #{part} at #{off}, #{len} bytes, is outside the #{limit}-byte header block"
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

  # Writes the response packets of one request into one buffer, sent at a flush: REQ_RECEIVED
  # and the head go out with the first body chunk, and an Array body goes out whole together
  # with RESP_END (up to FLUSH_AT bytes per write), so a small response is one write.
  # REQ_RECEIVED waits for the head, as in the WSGI launcher: corral takes from it only that
  # a byte came, so sent alone it would wake corral once more per request and end its
  # first_byte_timeout before the app answered. (A kept connection closed before any byte
  # reads to corral as stale, and corral resends a request only when not one byte of it was
  # written.)
  # One Writer serves all the requests of a connection, each begun by `start`. Its buffer
  # is a new String per response, not one cleared and reused: Ruby 3.1 frees a String's
  # memory when it is cleared, and memory grown again under a long-lived object counts
  # towards major collections (measured: 91 major GCs in 220,000 requests against 3).
  class Writer
    FLUSH_AT = 64 * 1024

    def initialize(io)
      @io = io
    end

    # A new response in `order`'s byte order; returns self.
    def start(order)
      @o = order
      @out = order.received.dup
      @head_queued = false
      @started = false
      @sent = false
      self
    end

    # Whether RESP_HEADER has left: until then an error can still become a 500.
    def started?
      @started
    end

    # Forgets the queued packets (a response that failed before anything of it was sent).
    def discard
      @out = @sent ? String.new(encoding: Encoding::BINARY) : @o.received.dup
      @head_queued = false
    end

    # RESP_HEADER: int32 count, int32 status, int16 length of each line (NUL included), the
    # NUL-terminated lines.
    def head(status, lines)
      count = lines.size
      raise ArgumentError, "#{count} response headers, over #{MAX_RESP_HEADERS}" if count > MAX_RESP_HEADERS

      # The pack's arguments: the packet header, count, status, each line's length (its NUL
      # included), then the lines.
      args = ['LS', RESP_HEADER, @o.flag, 0, count, status]
      total = PACKET_HEADER_LEN + 8 + 3 * count
      i = 0
      while i < count
        size = lines[i].bytesize
        total += size
        args << size + 1
        i += 1
      end
      raise ArgumentError, "response headers take #{total} bytes, over #{MAX_HEADER_PACKET}" if total > MAX_HEADER_PACKET

      args[3] = total
      args.concat(lines).pack(@o.head_format(count), buffer: @out)
      @head_queued = true
    end

    # RESP_STREAM packets of at most 16 KiB; sent now unless `now` is false.
    def body(data, now: true)
      size = data.bytesize
      if size <= MAX_DATA
        ['LS', RESP_STREAM, @o.flag, PACKET_HEADER_LEN + size, data].pack(@o.stream, buffer: @out)
      else
        at = 0
        while at < size
          part = data.byteslice(at, MAX_DATA)
          ['LS', RESP_STREAM, @o.flag, PACKET_HEADER_LEN + part.bytesize, part].pack(@o.stream, buffer: @out)
          at += MAX_DATA
        end
      end
      flush if now || @out.bytesize >= FLUSH_AT
    end

    def finish
      @out << @o.resp_end
      flush(true)
    end

    # Sends what is queued; `last`: nothing more of this response follows.
    def flush(last = false)
      return if @out.empty?

      @started ||= @head_queued
      @sent = true
      @io.write(@out)
      @out = last ? EMPTY : String.new(encoding: Encoding::BINARY)
    rescue IOError, SystemCallError => e
      raise PeerGone, e.message
    end
  end

  # Header names seen before: name => the line's prefix ("name: "), or :skip (Status and
  # rack.* are not sent) or :hop (hop-by-hop, dropped). Bounded, so an app inventing names
  # cannot grow it without end.
  NAMES = {}
  MAX_NAMES = 512

  def self.name_verdict(name)
    text = name.to_s
    raise ArgumentError, "header name #{text.inspect} is not an HTTP token" unless HEADER_NAME.match?(text)

    down = text.downcase
    verdict = if down == 'status' || down.start_with?('rack.') then :skip
              elsif HOP_BY_HOP.include?(down) then :hop
              else "#{text}: ".freeze
              end
    NAMES[name.frozen? ? name : name.dup.freeze] = verdict if NAMES.size < MAX_NAMES
    verdict
  end

  # The response's Content-Length when it is one plain count (Rack 3 names it in lower
  # case, Rack 2 apps often not), else nil.
  def self.content_length(headers)
    value = headers['content-length'] || headers['Content-Length']
    value.is_a?(String) && value.match?(/\A[0-9]{1,18}\z/) ? value.to_i : nil
  end

  # Turns a Rack response into status and header lines, or raises ArgumentError.
  def self.response_lines(status, headers)
    code = status.is_a?(Integer) ? status : Integer(status)
    raise ArgumentError, "status #{status.inspect} is not 100..999" unless code.between?(100, 999)

    lines = []
    headers.each do |name, value|
      prefix = NAMES[name] || name_verdict(name)
      next if prefix == :skip

      # Rack 3: an Array of values; Rack 2: one String, "\n" between values.
      if value.is_a?(String) && !value.include?("\n")
        values = nil
      else
        values = value.is_a?(Array) ? value : value.to_s.split("\n")
        values = [''] if values.empty? && !value.is_a?(Array)
      end
      if prefix == :hop
        log("dropped hop-by-hop header #{name}: #{Array(values || value).join(', ')} (the gateway owns the connection)")
        next
      end
      if values.nil?
        lines << header_line(name, prefix, value)
      else
        values.each { |v| lines << header_line(name, prefix, v.to_s) }
      end
    end
    [code, lines]
  end

  def self.header_line(name, prefix, value)
    ok = value.ascii_only? ? HEADER_VALUE.match?(value) : HEADER_VALUE.match?(value.b)
    raise ArgumentError, "header #{name} has a value with a control character" unless ok

    line = prefix + value
    raise ArgumentError, "header #{name} is longer than #{MAX_HEADER_LINE} bytes" if line.bytesize > MAX_HEADER_LINE

    line
  end

  # Serves requests on one connection until the peer closes it or something breaks. The
  # connection has its own receive buffer: one read usually brings a whole BEGIN_REQUEST
  # and a small body, parsed where they lie.
  class Connection
    def initialize(server, io)
      @server = server
      @io = io
      @served = 0
      # Bytes received; those before @at are consumed.
      @buf = String.new(capacity: CHUNK, encoding: Encoding::BINARY)
      @at = 0
      @chunk = String.new(capacity: CHUNK, encoding: Encoding::BINARY)
      @parser = Parser.new
      @writer = Writer.new(io)
    end

    def serve
      loop do
        @server.state = :idle
        return if @server.stopping
        raise Promote if @server.promote

        request = read_request
        return if request.nil?

        @server.state = :busy
        request.number = (@served += 1)
        writer = @writer.start(request.order)
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

    def buffered
      @buf.bytesize - @at
    end

    # Receives until `n` bytes are buffered; false when the peer closed first.
    def fill(n)
      while buffered < n
        if @at == @buf.bytesize
          # Nothing left to keep: read straight into the buffer (emptied at EOF).
          @at = 0
          @io.sysread(CHUNK, @buf)
        else
          @buf = @buf.byteslice(@at, buffered) if @at.positive?
          @at = 0
          @buf << @io.sysread(CHUNK, @chunk)
        end
      end
      true
    rescue EOFError
      false
    end

    # The next BEGIN_REQUEST; nil when the peer closed cleanly between requests (or only
    # probed the socket) or gave up the connection with ABORT_REQUEST.
    def read_request
      unless fill(PACKET_HEADER_LEN)
        return nil if buffered.zero?

        raise BadRequest, "connection closed inside a packet header (#{buffered} of 8 bytes)"
      end
      b = @at
      raise BadRequest, "packet magic is #{@buf.byteslice(b, 2).inspect}, not \"LS\"" unless @buf.getbyte(b) == 76 && @buf.getbyte(b + 1) == 83

      order = ORDERS[@buf.getbyte(b + 3) & 1]
      head = @buf.unpack(order.head, offset: b)
      type = head[1]
      len = head[2]
      return nil if type == ABORT_REQUEST && len == PACKET_HEADER_LEN # the server gives up: close
      raise BadRequest, "packet type #{type} is not BEGIN_REQUEST (1)" unless type == BEGIN_REQUEST
      unless len >= REQ_HEADER_LEN + 8 + HEADER_INDEX_LEN && len <= MAX_HEADER_PACKET
        raise BadRequest, "BEGIN_REQUEST length #{len} is outside #{REQ_HEADER_LEN + 8 + HEADER_INDEX_LEN}..#{MAX_HEADER_PACKET}"
      end
      # The usual packet came whole with its header; any other is read to its end first.
      unless buffered >= len
        raise BadRequest, "connection closed inside BEGIN_REQUEST (#{buffered} of #{len} bytes)" unless fill(len)

        b = @at
        head = @buf.unpack(order.head, offset: b)
      end
      @at = b + len
      @parser.parse(@buf, b, len, order, head)
    end

    # Exactly `len` raw bytes: a StringIO up to 1 MiB, a temporary file above.
    def read_body(len)
      return StringIO.new(EMPTY) if len.zero?

      if len <= MEMORY_BODY
        short!(buffered, len) unless fill(len)
        data = @buf.byteslice(@at, len)
        @at += len
        return StringIO.new(data)
      end
      file = Tempfile.new('corral-rack-body')
      file.binmode
      file.unlink
      left = len
      begin
        while left.positive?
          short!(len - left, len) unless fill(1)
          take = [left, buffered].min
          file.write(@buf.byteslice(@at, take))
          @at += take
          left -= take
        end
      rescue StandardError
        file.close
        raise
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
    attr_accessor :state, :promote
    attr_reader :stopping

    def initialize(app, rack_version)
      @app = app
      @state = :idle
      @stopping = false
      @promote = false
      # What every env holds, merged in one call.
      @base = {
        'rack.multithread' => false, 'rack.multiprocess' => true, 'rack.run_once' => false,
        'rack.hijack?' => false
      }
      @base['rack.version'] = rack_version if rack_version
      @base.freeze
      @gcs = GC.count
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

    # PROMOTE_SIGNAL (SIGURG) from corral: between requests the wait is left at once;
    # during one (corral drains the worker first, so only by a race) once it is answered.
    # The control socket is read afterwards, outside the trap.
    def trap_promote
      Signal.trap('URG') do
        @promote = true
        raise Promote if @state == :idle
      end
    end

    def run(socket)
      if listening?(socket)
        until @stopping
          raise Promote if @promote

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
      # Ruby makes sockets non-blocking, so a read that finds the next request not there
      # yet costs read, poll and read again; blocking, it is one read (a signal still
      # interrupts it, and the trap runs).
      conn.nonblock = false
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
        case write_body(body, writer, headers)
        when :ended then true
        when :overrun
          CorralRack.log("#{env['REQUEST_METHOD']} #{env['PATH_INFO']}: the body gave more than its Content-Length; the connection closes")
          false
        else
          writer.finish
          true
        end
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

    # One warm-up request in the preloader (Preloader.warm_up): GET / from 127.0.0.1 with
    # the header `X-Corral-Warmup: 1`, no body, answered by the app and dropped. Returns the
    # status; raises what the app raised.
    def warm_up
      env = {
        'REQUEST_METHOD' => 'GET', 'SCRIPT_NAME' => '', 'PATH_INFO' => '/', 'QUERY_STRING' => +'',
        'REQUEST_URI' => '/', 'SERVER_NAME' => 'localhost', 'SERVER_PORT' => '80',
        'SERVER_PROTOCOL' => 'HTTP/1.1', 'REMOTE_ADDR' => '127.0.0.1', 'HTTP_HOST' => 'localhost',
        WARMUP_HEADER => '1'
      }
      env = rack_env(Request.new(ORDERS[0], env, 0, 1), StringIO.new(EMPTY.dup))
      status, headers, body = @app.call(env)
      begin
        body.each { |_| nil } if body.respond_to?(:each)
      ensure
        close_body(body)
        finished(env, status, headers, nil)
      end
      status.to_i
    end

    private

    def listening?(socket)
      socket.getpeername
      false
    rescue Errno::ENOTCONN, Errno::EINVAL
      true
    end

    # Each chunk of a streaming body is sent as soon as it is yielded; an Array body is
    # complete already and leaves with RESP_END. The chunk of a streaming body that
    # completes its Content-Length leaves with RESP_END too, before the body has ended
    # (:ended): corral stops reading an answer once it has the announced bytes and drops an
    # exchange whose end has not come with them, losing a connection it could keep. Bytes
    # past it cannot follow RESP_END (:overrun: the connection closes).
    def write_body(body, writer, headers)
      if body.respond_to?(:each)
        now = !body.is_a?(Array)
        left = now ? CorralRack.content_length(headers) : nil
        ended = overrun = false
        body.each do |chunk|
          raise TypeError, "the body yielded #{chunk.class}, not String" unless chunk.is_a?(String)
          next if chunk.empty?

          if ended
            overrun = true
            break
          end
          if left && (left -= chunk.bytesize).zero?
            writer.body(chunk, now: false)
            writer.finish
            ended = true
          else
            writer.body(chunk, now: now)
          end
        end
        return :overrun if overrun

        ended ? :ended : nil
      elsif body.respond_to?(:call)
        writer.flush
        body.call(Stream.new(writer))
        nil
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
      trim_after_gc if TRIM
      callbacks = env['rack.response_finished']
      return unless callbacks.is_a?(Array)

      callbacks.reverse_each do |callback|
        callback.call(env, status, headers, error)
      rescue StandardError => e
        CorralRack.log("a rack.response_finished callback raised #{e.class}: #{e.message}")
      end
    end

    # After a request during which Ruby collected garbage, the malloc pages the collection
    # left wholly free go back to the kernel (about 0.1 ms on a Rails worker's 25 MiB heap;
    # Rails collects every few requests, a hello-world app every few thousand). In a forked
    # worker such a page is most often a private copy of a page it shared with the
    # preloader: keeping it costs a page per worker for nothing. Measured on the Rails shop
    # (benches/refork.sh peers), 8 workers: 13 MiB less summed PSS (docs/pools.md, "Preload
    # and fork"). CORRAL_RACK_TRIM=off in the pool's env leaves the heap alone.
    def trim_after_gc
      count = GC.count
      return if count == @gcs

      @gcs = count
      CorralRack.malloc_trim
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
      method = env['REQUEST_METHOD']
      env['REQUEST_METHOD'] = 'GET' if method.nil? || method.empty?
      env['QUERY_STRING'] ||= +''
      protocol = env['SERVER_PROTOCOL']
      env['SERVER_PROTOCOL'] = 'HTTP/1.1' unless protocol&.start_with?('HTTP/')
      https = env['HTTPS']
      scheme = https && HTTPS_ON.include?(https.downcase) ? 'https' : 'http'
      server(env, scheme)
      paths(env)
      if request.body_len.positive? || env.key?('CONTENT_LENGTH')
        env['CONTENT_LENGTH'] = request.body_len.to_s
      end
      env.delete('CONTENT_TYPE') if env['CONTENT_TYPE'] == ''
      env.update(@base)
      env['rack.url_scheme'] = scheme
      env['rack.input'] = input
      env['rack.errors'] = $stderr
      env['rack.response_finished'] = []
      # How many requests this LSAPI connection has carried, this one included: above 1
      # when corral reuses its persistent connection.
      env['corral.connection_requests'] = request.number
      env
    end

    TRIM = ENV['CORRAL_RACK_TRIM'] != 'off'
    HTTPS_ON = { 'on' => true, '1' => true, 'yes' => true }.freeze
    PORT = /\A[0-9]+\z/.freeze

    # SERVER_NAME and SERVER_PORT, from the Host header when corral sent none.
    def server(env, scheme)
      name = env['SERVER_NAME']
      port = env['SERVER_PORT']
      name_ok = !(name.nil? || name.empty?)
      port_ok = !port.nil? && PORT.match?(port)
      return if name_ok && port_ok

      host, host_port = split_host(env['HTTP_HOST'].to_s)
      env['SERVER_NAME'] = host || 'localhost' unless name_ok
      env['SERVER_PORT'] = host_port || (scheme == 'https' ? '443' : '80') unless port_ok
    end

    # Rack: SCRIPT_NAME is "" at the root, never "/"; PATH_INFO is "" or starts with "/".
    def paths(env)
      script = env['SCRIPT_NAME'] || ''
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
    # process corral tracks it through; a worker whose parent is already gone exits. With no
    # parent (a promoted template), the signal is cleared instead.
    def self.parent_death_signal(parent)
      require 'fiddle'
      prctl = Fiddle::Function.new(
        Fiddle::Handle::DEFAULT['prctl'],
        [Fiddle::TYPE_INT, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG],
        Fiddle::TYPE_INT
      )
      prctl.call(PR_SET_PDEATHSIG, parent ? Signal.list.fetch('KILL') : 0, 0, 0, 0)
    rescue LoadError, Fiddle::DLError, KeyError => e
      CorralRack.log("cannot set the parent-death signal: #{e.message}")
    ensure
      exit!(1) if parent && Process.ppid != parent
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

    # Whether corral wrote `promote` on the worker's control socket `channel`.
    def self.promote?(channel)
      msg = channel.recv_nonblock(MAX_CONTROL, exception: false)
      msg == 'promote'
    rescue IOError, SystemCallError
      false
    end

    # Serves `listener` until the worker stops, or until corral promotes it: then the
    # worker, idle, closes its listener and becomes the template on `channel`
    # (docs/pools.md, "Reforking"): `ready`, then forks on request as a preloader does.
    def self.serve_or_promote(app, version, server, listener, channel)
      begin
        server.run(listener)
        return
      rescue Promote
        server.promote = false
        # A stray SIGURG (the app's own sockets): serve on.
        retry unless promote?(channel)
      end
      listener.close
      Signal.trap('URG', 'SYSTEM_DEFAULT')
      # The old template retires once its workers are gone: this one outlives it (and still
      # exits when corral closes the control socket).
      parent_death_signal(nil)
      CorralRack.log("worker #{Process.pid} promoted to be the template")
      run(app, version, channel)
    end

    # Forks one worker serving the listening socket `listener` (and holding `channel`, its
    # own control socket, when the pool reforks); returns its pid.
    def self.fork_worker(app, version, control, wake, listener, channel)
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
        server.trap_promote if channel
        # A stop signal that came before the worker's own handlers went to the preloader's
        # (copied by the fork), which only raised its flag.
        exit!(0) if @stopping
        if channel
          serve_or_promote(app, version, server, listener, channel)
        else
          server.run(listener)
        end
        exit!(0)
      end
      listener.close
      channel&.close
      pid
    end

    # Makes what the workers inherit as shareable as it can be, once, before the first
    # fork (and a promoted template's): full collections until every object that survives
    # is in the old generation (a worker's minor collections then leave its page alone, and
    # its mark bits stay unwritten), a compaction that packs those objects into fewer pages
    # (free slots between them would be filled, so written, by each worker's allocations),
    # and malloc_trim for the memory freed. Ruby 3.3's Process.warmup does all of it.
    # Passenger runs one GC.start before each fork; nakayoshi_fork and Pitchfork age the
    # heap this way. CORRAL_RACK_SETTLE=off leaves the heap as loading left it.
    def self.settle_heap
      return if ENV['CORRAL_RACK_SETTLE'] == 'off'
      return Process.warmup if Process.respond_to?(:warmup)

      # An object becomes old after surviving three collections.
      4.times { GC.start(full_mark: true, immediate_sweep: true) }
      begin
        GC.compact if GC.respond_to?(:compact)
      rescue NotImplementedError, StandardError => e
        CorralRack.log("cannot compact the heap before forking: #{e.class}: #{e.message}")
      end
      malloc_trim
    end

    def self.malloc_trim
      CorralRack.malloc_trim
    end

    # Warm-up requests before the first fork: none unless the pool's env sets
    # CORRAL_RACK_WARMUP to a count (at most WARMUP_MAX). Opt-in: Passenger, Puma and
    # Pitchfork call no app code in their preloader, and an app may count, write or open
    # connections on GET / (docs/pools.md, "Preload and fork").
    WARMUP_MAX = 1000
    # Warm-up stops once it has taken this long, in seconds.
    WARMUP_BUDGET = 2.0

    # Before the first fork, when the pool asks for it (CORRAL_RACK_WARMUP), the preloader
    # asks the app for GET / a few times (with `X-Corral-Warmup: 1`, so an app can tell these
    # from real requests), and drops the answers: what an app builds on its first request (Rails: its routes' and templates'
    # compiled methods, the call sites' caches, and YJIT's machine code for the path, as
    # YJIT compiles a method on its tenth call) is then built once, before settle_heap,
    # and shared by every worker instead of being built again in each. Measured on the
    # Rails shop (benches/refork.sh peers), 8 workers: 27 MiB less summed PSS. Stops
    # at the first answer that is not 2xx or 3xx, at the first exception (the app may need
    # what only a worker has), and after WARMUP_BUDGET seconds; none of these stops the
    # preloader. Not for a promoted template: its worker has served real requests.
    def self.warm_up(app, version)
      done = 0
      count = warmup_count
      return if count.zero?

      server = Server.new(app, version)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      while done < count
        status = server.warm_up
        done += 1
        unless status >= 200 && status < 400
          CorralRack.log("warm-up stops at request #{done}: GET / answered #{status}")
          return
        end
        break if Process.clock_gettime(Process::CLOCK_MONOTONIC) - started > WARMUP_BUDGET
      end
      elapsed = ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000).round
      CorralRack.log("warm-up: #{done} GET / answered in #{elapsed} ms")
    rescue StandardError, ScriptError, SystemStackError => e
      CorralRack.log("warm-up stops at request #{done + 1}: GET / raised #{e.class}: #{e.message}")
    end

    def self.warmup_count
      value = ENV.fetch('CORRAL_RACK_WARMUP', 'off')
      return 0 if value == 'off'
      return [value.to_i, WARMUP_MAX].min if value.match?(/\A[0-9]{1,6}\z/)

      CorralRack.log("CORRAL_RACK_WARMUP=#{value.inspect} is neither a count nor off; no warm-up")
      0
    end

    # The preloader's loop: fork workers on request, reap them, report both.
    def self.run(app, version, control)
      settle_heap
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
        # One descriptor: the worker's listening socket; two: also the worker's own control
        # socket (a pool that reforks).
        unless words.size == 2 && words[0] == 'fork' && words[1].match?(/\A[0-9]+\z/) && [1, 2].include?(ios.size)
          ios.each(&:close)
          CorralRack.log("ignoring a malformed control message (#{msg.bytesize} bytes, #{ios.size} descriptors)")
          next
        end
        listener = Socket.for_fd(ios[0].fileno)
        ios[0].autoclose = false
        channel = nil
        if ios.size == 2
          channel = Socket.for_fd(ios[1].fileno)
          ios[1].autoclose = false
        end
        pid = fork_worker(app, version, control, [wake_r, wake_w], listener, channel)
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

  # Machine code YJIT may write, in MiB, when a pool asks for YJIT on Ruby 3.1 or 3.2.
  # Ruby 3.1 fills the whole area at start (256 MiB by default, all resident; shared with
  # forked workers until written), and its bookkeeping per compiled block grows with the
  # code. Once the area is full YJIT stops compiling. 1 MiB holds the request loop and a
  # small app's hot paths: the Rack hello world is as fast as with 8. Measured on a Rails
  # 6.1 shop (benches/refork.sh peers), the summed PSS of 2 workers and the preloader was
  # 129 MiB with 8, 106 with 1, 96 to 99 without YJIT.
  YJIT_MEM_MIB = 1

  # YJIT where this Ruby has it and the launcher can turn it on after start: Ruby 3.3 and
  # later turn it on in place, unless the pool's env says CORRAL_RACK_YJIT=off or sets
  # RUBY_YJIT_ENABLE itself. Ruby 3.1 and 3.2 read YJIT only at start, and there it is off
  # unless the pool's env says CORRAL_RACK_YJIT=on: the launcher then starts again (same
  # pid, fd 0 and arguments) as `ruby --yjit --yjit-exec-mem-size=1`. Why off there
  # (docs/decisions.md, 34): the app's boot, compiled as it runs, fills a small area before
  # the first request (a Rails 6.1 shop fills 1 MiB before its preloader forks), so the
  # request path runs in the interpreter all the same, and YJIT's bookkeeping still costs
  # about 2 MiB per process (benches/refork.sh peers: 2 Rails workers and their preloader
  # 104 MiB with YJIT, 97 without, no faster); a larger area is compiled again in every
  # worker. Only an app small enough to leave room (a hello world: about a fifth more
  # requests per second) gains; Ruby, Passenger and Puma leave YJIT off on these versions.
  # Ruby options other than --disable-gems are not carried over; corral starts the
  # launcher with none.
  def self.enable_yjit(argv)
    choice = ENV.delete('CORRAL_RACK_YJIT')
    return if choice == 'restarted' || ENV.key?('RUBY_YJIT_ENABLE')
    unless choice.nil? || choice == 'on' || choice == 'off'
      log("CORRAL_RACK_YJIT=#{choice.inspect} is neither on nor off; the default holds")
      choice = nil
    end
    return if choice == 'off'
    return unless defined?(RubyVM::YJIT) && !RubyVM::YJIT.enabled?
    return RubyVM::YJIT.enable if RubyVM::YJIT.respond_to?(:enable)
    return unless choice == 'on'
    return log('CORRAL_RACK_YJIT=on: this Ruby was built without YJIT') if RbConfig::CONFIG['YJIT_SUPPORT'] == 'no'

    ENV['CORRAL_RACK_YJIT'] = 'restarted'
    options = ['--yjit', "--yjit-exec-mem-size=#{YJIT_MEM_MIB}"]
    options << '--disable-gems' unless defined?(Gem)
    exec(RbConfig.ruby, *options, __FILE__, *argv)
  rescue SystemCallError => e
    ENV.delete('CORRAL_RACK_YJIT')
    log("cannot start again with YJIT (#{e.message}); serving without it")
  end

  def self.main(argv)
    enable_yjit(argv)
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
    rack += defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? ', YJIT' : ', no YJIT'
    bundled = gemfile ? ", bundle #{gemfile}" : ''
    unless preloading
      # Traps first: a SIGTERM sent as soon as the log says "serving" finds them set.
      server = Server.new(app, version)
      server.trap_signals
    end
    log("#{preloading ? 'preloaded' : 'serving'} #{argv[0]} (Ruby #{RUBY_VERSION} at #{RbConfig.ruby}, #{rack}#{bundled}, pid #{Process.pid})")
    if preloading
      Preloader.warm_up(app, version)
      Preloader.run(app, version, socket)
      return 0
    end
    server.run(socket)
    0
  end
end

exit(CorralRack.main(ARGV)) if $PROGRAM_NAME == __FILE__

;; WebAssembly SIMD128 kernels for the browser trainer's hot loops.
;; The module imports the host's linear memory ("env" "memory") so that every
;; pointer argument is a byte address of a float32 array already living there
;; (Pyodide's heap): no copies in or out.
(module
  (import "env" "memory" (memory 1))

  ;; C[M,N] (+)= A[M,K] @ B[K,N].
  ;; A is read with element strides (sa_row, sa_col), so A.T is passed by swapping
  ;; them; B and C are row-major with row strides ldb, ldc (elements).
  ;; accumulate = 0 overwrites C, 1 adds to it.
  ;; Tiles of 4 rows x 8 columns keep their 8 vectors of C in registers over all of K
  ;; (each B vector loaded serves 4 rows); the rows and columns left over go through
  ;; $panel, one row of C at a time.
  (func (export "gemm_nn")
    (param $m i32) (param $n i32) (param $k i32)
    (param $a i32) (param $sa_row i32) (param $sa_col i32)
    (param $b i32) (param $ldb i32)
    (param $c i32) (param $ldc i32) (param $accumulate i32)
    (local $m4 i32) (local $n8 i32) (local $i i32) (local $j i32) (local $p i32)
    (local $arow i32) (local $astep i32) (local $ap i32) (local $bp i32) (local $cp i32)
    (local $ra i32) (local $rc i32) (local $b0 v128) (local $b1 v128) (local $av v128)
    (local $c00 v128) (local $c01 v128) (local $c10 v128) (local $c11 v128)
    (local $c20 v128) (local $c21 v128) (local $c30 v128) (local $c31 v128)
    (local.set $m4 (i32.and (local.get $m) (i32.const -4)))
    (local.set $n8 (i32.and (local.get $n) (i32.const -8)))
    (local.set $ra (i32.shl (local.get $sa_row) (i32.const 2)))  ;; bytes between rows of A
    (local.set $rc (i32.shl (local.get $ldc) (i32.const 2)))     ;; bytes between rows of C
    (local.set $astep (i32.shl (local.get $sa_col) (i32.const 2)))
    (block $done_i (loop $loop_i
      (br_if $done_i (i32.ge_u (local.get $i) (local.get $m4)))
      (local.set $arow (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $ra))))
      (local.set $j (i32.const 0))
      (block $done_j (loop $loop_j
        (br_if $done_j (i32.ge_u (local.get $j) (local.get $n8)))
        (local.set $c00 (v128.const f32x4 0 0 0 0)) (local.set $c01 (v128.const f32x4 0 0 0 0))
        (local.set $c10 (v128.const f32x4 0 0 0 0)) (local.set $c11 (v128.const f32x4 0 0 0 0))
        (local.set $c20 (v128.const f32x4 0 0 0 0)) (local.set $c21 (v128.const f32x4 0 0 0 0))
        (local.set $c30 (v128.const f32x4 0 0 0 0)) (local.set $c31 (v128.const f32x4 0 0 0 0))
        (local.set $ap (local.get $arow))
        (local.set $bp (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2))))
        (local.set $p (i32.const 0))
        (block $done_p (loop $loop_p
          (br_if $done_p (i32.ge_u (local.get $p) (local.get $k)))
          (local.set $b0 (v128.load (local.get $bp)))
          (local.set $b1 (v128.load offset=16 (local.get $bp)))
          (local.set $av (f32x4.splat (f32.load (local.get $ap))))
          (local.set $c00 (f32x4.add (local.get $c00) (f32x4.mul (local.get $av) (local.get $b0))))
          (local.set $c01 (f32x4.add (local.get $c01) (f32x4.mul (local.get $av) (local.get $b1))))
          (local.set $av (f32x4.splat (f32.load (i32.add (local.get $ap) (local.get $ra)))))
          (local.set $c10 (f32x4.add (local.get $c10) (f32x4.mul (local.get $av) (local.get $b0))))
          (local.set $c11 (f32x4.add (local.get $c11) (f32x4.mul (local.get $av) (local.get $b1))))
          (local.set $av (f32x4.splat (f32.load (i32.add (local.get $ap)
            (i32.shl (local.get $ra) (i32.const 1))))))
          (local.set $c20 (f32x4.add (local.get $c20) (f32x4.mul (local.get $av) (local.get $b0))))
          (local.set $c21 (f32x4.add (local.get $c21) (f32x4.mul (local.get $av) (local.get $b1))))
          (local.set $av (f32x4.splat (f32.load (i32.add (local.get $ap)
            (i32.mul (local.get $ra) (i32.const 3))))))
          (local.set $c30 (f32x4.add (local.get $c30) (f32x4.mul (local.get $av) (local.get $b0))))
          (local.set $c31 (f32x4.add (local.get $c31) (f32x4.mul (local.get $av) (local.get $b1))))
          (local.set $ap (i32.add (local.get $ap) (local.get $astep)))
          (local.set $bp (i32.add (local.get $bp) (i32.shl (local.get $ldb) (i32.const 2))))
          (local.set $p (i32.add (local.get $p) (i32.const 1)))
          (br $loop_p)))
        (local.set $cp (i32.add (local.get $c) (i32.add (i32.mul (local.get $i) (local.get $rc))
          (i32.shl (local.get $j) (i32.const 2)))))
        (call $store2 (local.get $cp) (local.get $c00) (local.get $c01) (local.get $accumulate))
        (local.set $cp (i32.add (local.get $cp) (local.get $rc)))
        (call $store2 (local.get $cp) (local.get $c10) (local.get $c11) (local.get $accumulate))
        (local.set $cp (i32.add (local.get $cp) (local.get $rc)))
        (call $store2 (local.get $cp) (local.get $c20) (local.get $c21) (local.get $accumulate))
        (local.set $cp (i32.add (local.get $cp) (local.get $rc)))
        (call $store2 (local.get $cp) (local.get $c30) (local.get $c31) (local.get $accumulate))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $loop_j)))
      (local.set $i (i32.add (local.get $i) (i32.const 4)))
      (br $loop_i)))
    ;; rows m4.. of columns 0..n8, then every row of columns n8..n
    (call $panel (i32.sub (local.get $m) (local.get $m4)) (local.get $n8) (local.get $k)
      (i32.add (local.get $a) (i32.mul (local.get $m4) (local.get $ra))) (local.get $sa_row) (local.get $sa_col)
      (local.get $b) (local.get $ldb)
      (i32.add (local.get $c) (i32.mul (local.get $m4) (local.get $rc))) (local.get $ldc) (local.get $accumulate))
    (call $panel (local.get $m) (i32.sub (local.get $n) (local.get $n8)) (local.get $k)
      (local.get $a) (local.get $sa_row) (local.get $sa_col)
      (i32.add (local.get $b) (i32.shl (local.get $n8) (i32.const 2))) (local.get $ldb)
      (i32.add (local.get $c) (i32.shl (local.get $n8) (i32.const 2))) (local.get $ldc) (local.get $accumulate)))

  ;; C[0..8) at address c = (lo, hi), or += where accumulate is 1.
  (func $store2 (param $c i32) (param $lo v128) (param $hi v128) (param $accumulate i32)
    (if (local.get $accumulate) (then
      (local.set $lo (f32x4.add (local.get $lo) (v128.load (local.get $c))))
      (local.set $hi (f32x4.add (local.get $hi) (v128.load offset=16 (local.get $c))))))
    (v128.store (local.get $c) (local.get $lo))
    (v128.store offset=16 (local.get $c) (local.get $hi)))

  ;; gemm_nn's contract, one row of C at a time: row i of A times B, 4 columns a step.
  (func $panel
    (param $m i32) (param $n i32) (param $k i32)
    (param $a i32) (param $sa_row i32) (param $sa_col i32)
    (param $b i32) (param $ldb i32)
    (param $c i32) (param $ldc i32) (param $accumulate i32)
    (local $i i32) (local $j i32) (local $p i32)
    (local $crow i32) (local $brow i32) (local $aval f32) (local $av v128)
    (local $n4 i32)
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (local.set $i (i32.const 0))
    (block $done_i (loop $loop_i
      (br_if $done_i (i32.ge_u (local.get $i) (local.get $m)))
      (local.set $crow (i32.add (local.get $c)
        (i32.shl (i32.mul (local.get $i) (local.get $ldc)) (i32.const 2))))
      (if (i32.eqz (local.get $accumulate))
        (then (memory.fill (local.get $crow) (i32.const 0)
                (i32.shl (local.get $n) (i32.const 2)))))
      (local.set $p (i32.const 0))
      (block $done_p (loop $loop_p
        (br_if $done_p (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $aval (f32.load (i32.add (local.get $a) (i32.shl
          (i32.add (i32.mul (local.get $i) (local.get $sa_row))
                   (i32.mul (local.get $p) (local.get $sa_col))) (i32.const 2)))))
        (local.set $av (f32x4.splat (local.get $aval)))
        (local.set $brow (i32.add (local.get $b)
          (i32.shl (i32.mul (local.get $p) (local.get $ldb)) (i32.const 2))))
        (local.set $j (i32.const 0))
        (block $done_j (loop $loop_j
          (br_if $done_j (i32.ge_u (local.get $j) (local.get $n4)))
          (v128.store (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2)))
            (f32x4.add
              (v128.load (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))))
              (f32x4.mul (local.get $av)
                (v128.load (i32.add (local.get $brow) (i32.shl (local.get $j) (i32.const 2)))))))
          (local.set $j (i32.add (local.get $j) (i32.const 4)))
          (br $loop_j)))
        (block $done_t (loop $loop_t
          (br_if $done_t (i32.ge_u (local.get $j) (local.get $n)))
          (f32.store (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2)))
            (f32.add
              (f32.load (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))))
              (f32.mul (local.get $aval)
                (f32.load (i32.add (local.get $brow) (i32.shl (local.get $j) (i32.const 2)))))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br $loop_t)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $loop_p)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $loop_i))))

  ;; C[M,N] = A[M,K] @ B[N,K].T: A and B row-major with row strides lda, ldb, C with ldc
  ;; (elements). Each entry is a dot product along K (a dense layer's input gradient, dy @ kernel.T).
  (func (export "gemm_nt")
    (param $m i32) (param $n i32) (param $k i32)
    (param $a i32) (param $lda i32) (param $b i32) (param $ldb i32)
    (param $c i32) (param $ldc i32)
    (local $i i32) (local $j i32) (local $p i32) (local $k4 i32)
    (local $arow i32) (local $brow i32) (local $acc v128) (local $sum f32)
    (local.set $k4 (i32.and (local.get $k) (i32.const -4)))
    (block $done_i (loop $loop_i
      (br_if $done_i (i32.ge_u (local.get $i) (local.get $m)))
      (local.set $arow (i32.add (local.get $a)
        (i32.shl (i32.mul (local.get $i) (local.get $lda)) (i32.const 2))))
      (local.set $j (i32.const 0))
      (block $done_j (loop $loop_j
        (br_if $done_j (i32.ge_u (local.get $j) (local.get $n)))
        (local.set $brow (i32.add (local.get $b)
          (i32.shl (i32.mul (local.get $j) (local.get $ldb)) (i32.const 2))))
        (local.set $acc (v128.const f32x4 0 0 0 0))
        (local.set $p (i32.const 0))
        (block $done_p (loop $loop_p
          (br_if $done_p (i32.ge_u (local.get $p) (local.get $k4)))
          (local.set $acc (f32x4.add (local.get $acc) (f32x4.mul
            (v128.load (i32.add (local.get $arow) (i32.shl (local.get $p) (i32.const 2))))
            (v128.load (i32.add (local.get $brow) (i32.shl (local.get $p) (i32.const 2)))))))
          (local.set $p (i32.add (local.get $p) (i32.const 4)))
          (br $loop_p)))
        (local.set $sum (f32.add
          (f32.add (f32x4.extract_lane 0 (local.get $acc)) (f32x4.extract_lane 1 (local.get $acc)))
          (f32.add (f32x4.extract_lane 2 (local.get $acc)) (f32x4.extract_lane 3 (local.get $acc)))))
        (block $done_t (loop $loop_t
          (br_if $done_t (i32.ge_u (local.get $p) (local.get $k)))
          (local.set $sum (f32.add (local.get $sum) (f32.mul
            (f32.load (i32.add (local.get $arow) (i32.shl (local.get $p) (i32.const 2))))
            (f32.load (i32.add (local.get $brow) (i32.shl (local.get $p) (i32.const 2)))))))
          (local.set $p (i32.add (local.get $p) (i32.const 1)))
          (br $loop_t)))
        (f32.store (i32.add (local.get $c) (i32.shl
          (i32.add (i32.mul (local.get $i) (local.get $ldc)) (local.get $j)) (i32.const 2)))
          (local.get $sum))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $loop_j)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $loop_i))))

  ;; Fused Adam over n float32 elements:
  ;;   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;  p -= step * m / (sqrt(v) + eps)
  ;; where step = lr * sqrt(1-b2^t) / (1-b1^t) is computed by the caller.
  (func (export "adam")
    (param $n i32) (param $p i32) (param $g i32) (param $mm i32) (param $vv i32)
    (param $b1 f32) (param $b2 f32) (param $eps f32) (param $step f32)
    (local $i i32) (local $off i32) (local $n4 i32)
    (local $gv v128) (local $mv v128) (local $vv2 v128)
    (local $gs f32) (local $ms f32) (local $vs f32)
    (local.set $n4 (i32.and (local.get $n) (i32.const -4)))
    (block $done (loop $loop
      (br_if $done (i32.ge_u (local.get $i) (local.get $n4)))
      (local.set $off (i32.shl (local.get $i) (i32.const 2)))
      (local.set $gv (v128.load (i32.add (local.get $g) (local.get $off))))
      (local.set $mv (f32x4.add
        (f32x4.mul (f32x4.splat (local.get $b1)) (v128.load (i32.add (local.get $mm) (local.get $off))))
        (f32x4.mul (f32x4.splat (f32.sub (f32.const 1) (local.get $b1))) (local.get $gv))))
      (local.set $vv2 (f32x4.add
        (f32x4.mul (f32x4.splat (local.get $b2)) (v128.load (i32.add (local.get $vv) (local.get $off))))
        (f32x4.mul (f32x4.splat (f32.sub (f32.const 1) (local.get $b2)))
                   (f32x4.mul (local.get $gv) (local.get $gv)))))
      (v128.store (i32.add (local.get $mm) (local.get $off)) (local.get $mv))
      (v128.store (i32.add (local.get $vv) (local.get $off)) (local.get $vv2))
      (v128.store (i32.add (local.get $p) (local.get $off))
        (f32x4.sub (v128.load (i32.add (local.get $p) (local.get $off)))
          (f32x4.div (f32x4.mul (f32x4.splat (local.get $step)) (local.get $mv))
            (f32x4.add (f32x4.sqrt (local.get $vv2)) (f32x4.splat (local.get $eps))))))
      (local.set $i (i32.add (local.get $i) (i32.const 4)))
      (br $loop)))
    (block $done_t (loop $loop_t
      (br_if $done_t (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $off (i32.shl (local.get $i) (i32.const 2)))
      (local.set $gs (f32.load (i32.add (local.get $g) (local.get $off))))
      (local.set $ms (f32.add
        (f32.mul (local.get $b1) (f32.load (i32.add (local.get $mm) (local.get $off))))
        (f32.mul (f32.sub (f32.const 1) (local.get $b1)) (local.get $gs))))
      (local.set $vs (f32.add
        (f32.mul (local.get $b2) (f32.load (i32.add (local.get $vv) (local.get $off))))
        (f32.mul (f32.sub (f32.const 1) (local.get $b2)) (f32.mul (local.get $gs) (local.get $gs)))))
      (f32.store (i32.add (local.get $mm) (local.get $off)) (local.get $ms))
      (f32.store (i32.add (local.get $vv) (local.get $off)) (local.get $vs))
      (f32.store (i32.add (local.get $p) (local.get $off))
        (f32.sub (f32.load (i32.add (local.get $p) (local.get $off)))
          (f32.div (f32.mul (local.get $step) (local.get $ms))
            (f32.add (f32.sqrt (local.get $vs)) (local.get $eps)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $loop_t))))
)
